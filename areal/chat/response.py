"""Response bodies in OpenAI's shapes, from finished generations.

Chat completion (non-streaming):

    {"id": "chatcmpl-...", "object": "chat.completion", "created": 1700000000, "model": "...",
     "choices": [{"index": 0, "finish_reason": "stop" | "length" | "tool_calls" | "abort",
                  "message": {"role": "assistant", "content": "...", "tool_calls": [...]},
                  "logprobs": {"content": [{"token", "logprob", "bytes", "top_logprobs": []}]} | null,
                  "matched_stop": ...,
                  # SGLang's extensions, when asked for:
                  "prompt_token_ids": [...], "response_token_ids": [...], "meta_info": {...}}],
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens"},
     "metadata": {"weight_version": "..."}}

`meta_info` is the generation's /generate meta_info: finish_reason, token counts,
weight_version, output_version_spans ([[start, version], ...]: which weights produced which
output tokens) and, with logprobs, output_token_logprobs ([[logprob, token_id, null], ...]).

Streaming sends the same content as `chat.completion.chunk` objects over server-sent events:
a role chunk, a content chunk (with its logprobs), a tool_calls chunk, a finish chunk per
choice, a usage chunk with stream_options.include_usage, then `data: [DONE]`. The generation
has finished before the first chunk is sent (the servers report whole sequences), so each
piece comes in one chunk rather than token by token; clients that join deltas see the same.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from areal.chat.request import ChatRequest, CompletionRequest, Extensions
from areal.chat.tool_calls import ParsedReply, parse_reply


@dataclass
class Generation:
    """One finished choice: what both the server and the proxy know of it."""

    output_ids: list[int]
    text: str  # decoded and stop-trimmed
    finish_reason: str  # "stop" | "length" | "abort"
    logprobs: list[float] | None = None
    token_texts: list[str] | None = None  # one per output id, for logprobs
    matched_stop: int | str | None = None
    meta_info: dict | None = None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def parse_generation(req: ChatRequest, gen: Generation) -> ParsedReply:
    """The reply's content and tool calls (parsed only when the request offers tools)."""
    return parse_reply(gen.text, req.tool_names) if req.parses_tool_calls else ParsedReply(gen.text, None)


def chat_response(
    req: ChatRequest,
    gens: list[Generation],
    replies: list[ParsedReply],
    *,
    prompt_ids: list[int],
    weight_version: str | None,
    rid: str | None = None,
    created: int | None = None,
) -> dict:
    choices = []
    for index, (gen, reply) in enumerate(zip(gens, replies)):
        message = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice = {
            "index": index,
            "message": message,
            "logprobs": _chat_logprobs(gen) if req.logprobs else None,
            "finish_reason": _finish(gen, reply),
            "matched_stop": gen.matched_stop,
        }
        choices.append({**choice, **_extensions(req.extensions, gen, prompt_ids)})
    return _body("chatcmpl", "chat.completion", req.model, choices, prompt_ids, gens, weight_version, rid, created)


def completion_response(
    req: CompletionRequest,
    gens: list[Generation],
    *,
    prompt_ids: list[int],
    weight_version: str | None,
    rid: str | None = None,
    created: int | None = None,
) -> dict:
    choices = [
        {
            "index": i,
            "text": gen.text,
            "finish_reason": gen.finish_reason,
            "logprobs": _completion_logprobs(gen) if req.logprobs else None,
            "matched_stop": gen.matched_stop,
            **_completion_extensions(req.extensions, gen, prompt_ids),
        }
        for i, gen in enumerate(gens)
    ]
    return _body("cmpl", "text_completion", req.model, choices, prompt_ids, gens, weight_version, rid, created)


def _body(
    id_prefix: str,
    kind: str,
    model: str,
    choices: list[dict],
    prompt_ids: list[int],
    gens: list[Generation],
    weight_version: str | None,
    rid: str | None,
    created: int | None,
) -> dict:
    """What both response kinds put around their choices: id, object, time, model, usage, version."""
    return {
        "id": rid or new_id(id_prefix),
        "object": kind,
        "created": created or int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_ids, gens),
        "metadata": {"weight_version": weight_version},
    }


def usage(prompt_ids: list[int], gens: list[Generation]) -> dict:
    completion = sum(len(g.output_ids) for g in gens)
    return {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(prompt_ids) + completion,
    }


def _finish(gen: Generation, reply: ParsedReply) -> str:
    if reply.tool_calls and gen.finish_reason == "stop":
        return "tool_calls"
    return gen.finish_reason


def _chat_logprobs(gen: Generation) -> dict:
    texts = gen.token_texts or [""] * len(gen.output_ids)
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(texts, gen.logprobs or [])
        ],
        "refusal": None,
    }


def _completion_logprobs(gen: Generation) -> dict:
    texts = gen.token_texts or [""] * len(gen.output_ids)
    offsets, at = [], 0
    for t in texts:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": list(texts),
        "token_logprobs": list(gen.logprobs or []),
        "top_logprobs": None,
        "text_offset": offsets,
    }


def _extensions(ext: Extensions, gen: Generation, prompt_ids: list[int]) -> dict:
    out = {}
    if ext.return_prompt_token_ids or ext.return_token_ids:
        out["prompt_token_ids"] = list(prompt_ids)
    if ext.return_token_ids:
        out["response_token_ids"] = list(gen.output_ids)
    if ext.return_meta_info:
        out["meta_info"] = gen.meta_info
    return out


def _completion_extensions(ext: Extensions, gen: Generation, prompt_ids: list[int]) -> dict:
    """SGLang's completions name the output ids `token_ids`."""
    out = _extensions(ext, gen, prompt_ids)
    if "response_token_ids" in out:
        out["token_ids"] = out.pop("response_token_ids")
    return out


# ---- streaming ----------------------------------------------------------------------------------


def chat_chunks(response: dict, include_usage: bool) -> list[dict]:
    """The chunks a streaming client receives for `response` (a chat_response body)."""
    return _chunks(response, "chat.completion.chunk", include_usage, _chat_deltas)


def completion_chunks(response: dict, include_usage: bool) -> list[dict]:
    return _chunks(response, "text_completion", include_usage, _completion_deltas)


def _chunks(response: dict, kind: str, include_usage: bool, pieces) -> list[dict]:
    """One chunk per piece of every choice (`pieces(choice)`: its `choices` entries, in order), under
    the response's id, time and model; then the usage chunk when the client asked for it."""
    head = {k: response[k] for k in ("id", "created", "model")}
    head["object"] = kind
    tail = {"usage": None} if include_usage else {}
    out = [{**head, "choices": [piece], **tail} for choice in response["choices"] for piece in pieces(choice)]
    if include_usage:
        out.append({**head, "choices": [], "usage": response["usage"]})
    return out


def _chat_deltas(choice: dict) -> list[dict]:
    """A role delta, the content (with its logprobs), the tool calls, then the finish reason."""
    i, message = choice["index"], choice["message"]

    def delta(content: dict, finish=None, logprobs=None) -> dict:
        return {"index": i, "delta": content, "logprobs": logprobs, "finish_reason": finish}

    out = [delta({"role": "assistant", "content": ""})]
    if message["content"] or choice["logprobs"]:
        out.append(delta({"content": message["content"]}, logprobs=choice["logprobs"]))
    if message.get("tool_calls"):
        calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
        out.append(delta({"tool_calls": calls}))
    out.append(delta({}, finish=choice["finish_reason"]))
    return out


def _completion_deltas(choice: dict) -> list[dict]:
    """The text (with its logprobs), then the finish reason."""
    i = choice["index"]
    return [
        {"index": i, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None},
        {"index": i, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]},
    ]


def sse_events(chunks: list[dict]) -> list[bytes]:
    """Server-sent events: one `data: {json}` per chunk, then `data: [DONE]`."""
    return [f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


def error_body(message: str, *, status: int, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object (the openai client reads error.message, type, param, code)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
