"""The prompt of a follow-up call, built on the previous call's exact tokens.

An agent sends the whole conversation each time: [..., its earlier request's messages, the
assistant reply it got, new messages (tool results, a user turn)]. Rendering that afresh and
tokenizing it again would not give back the tokens the model generated: templates reformat tool
calls (`tojson` spacing), strip reasoning, and text re-tokenizes differently at the boundaries.
So the follow-up's prompt is

    previous prompt ids + previous output ids + tokens of continuation_text(...)

where the continuation is what the chat template writes after the assistant turn: the end of
that turn (less the end-of-turn token the model produced itself) and the new messages, up to
the generation prompt. The template finds it by rendering the conversation with a placeholder
for the assistant turn's content. Then every call's prompt extends the previous call's prompt
and output exactly, and a conversation is one token sequence with the model's own tokens in it.

Trade-off: the model sees its own output where a fresh render would show the template's
rewrite of it (e.g. a Qwen3 template drops earlier turns' <think> text; here it stays).
"""

from __future__ import annotations

import json

from areal.chat.template import content_text, render_chat

PLACEHOLDER = "\u2063areal-assistant-turn\u2063"  # invisible separators: no real content has it


def continuation_text(
    tokenizer,
    history: list[dict],
    new_messages: list[dict],
    *,
    ended_with: str | None,
    tools: list[dict] | None = None,
    template_kwargs: dict | None = None,
    chat_template: str | None = None,
) -> str | None:
    """The text after an assistant turn that followed `history`, through `new_messages` and the
    generation prompt. `ended_with` is the text of the end-of-turn token the model produced (its
    last token, when it stopped on a stop token), which the template's own end of turn then does
    not repeat. None when the template does not render the placeholder turn exactly once (the
    caller renders the conversation afresh)."""
    probe = [*history, {"role": "assistant", "content": PLACEHOLDER}, *new_messages]
    text = render_chat(
        tokenizer,
        probe,
        tools=tools,
        add_generation_prompt=True,
        template_kwargs=template_kwargs,
        chat_template=chat_template,
    )
    if text.count(PLACEHOLDER) != 1:
        return None
    after = text[text.index(PLACEHOLDER) + len(PLACEHOLDER) :]
    if ended_with and after.startswith(ended_with):
        after = after[len(ended_with) :]
    return after


def message_key(message: dict) -> tuple:
    """What identifies a message when a follow-up repeats it: role, text, tool calls (name and
    arguments, compared as JSON values), tool_call_id. Other keys (refusal, audio, ...) differ
    between clients and do not change the conversation."""
    calls = tuple(
        (c["function"]["name"], canonical_arguments(c["function"].get("arguments")))
        for c in message.get("tool_calls") or []
    )
    tool_call_id = message.get("tool_call_id") if message.get("role") == "tool" else None
    return message.get("role"), content_text(message.get("content")), calls, tool_call_id


def reply_key(content: str, tool_calls: list[dict] | None) -> tuple:
    return message_key({"role": "assistant", "content": content, "tool_calls": tool_calls})


def canonical_arguments(arguments) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)
