"""The OpenAI chat-completions protocol, shared by the built-in server's /v1 routes
(areal/server/openai_api.py) and the rollout-side proxy agents talk to
(areal/rollout/openai_proxy.py):

    request.py       validate /v1/chat/completions and /v1/completions bodies (400 naming the key)
    template.py      render messages and tools with the tokenizer's chat template
    continuation.py  the prompt of a follow-up call as the previous call's exact tokens + the new turns
    tool_calls.py    `<tool_call>{json}</tool_call>` blocks (Qwen/Hermes) -> OpenAI tool_calls
    response.py      response bodies, stream chunks (SSE) and logprobs in OpenAI's shapes
    http.py          the two aiohttp replies both sides send (JSON or server-sent events)

Functions on dicts and a tokenizer: no torch, and no import of areal.server (the trainer never
imports the server).
"""
