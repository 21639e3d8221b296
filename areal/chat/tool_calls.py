"""Tool calls in model output: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
(Hermes; Qwen2.5/3 write the same with newlines inside the tags) into OpenAI `tool_calls`.

    parse_reply('Let me add.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', {"add"})
    -> ParsedReply(content="Let me add.", tool_calls=[{"id": "call_...", "type": "function",
                   "function": {"name": "add", "arguments": '{"a": 1}'}}], malformed=None)

A reply whose blocks do not all parse (invalid JSON, no `name`, a tool the request did not
offer, `arguments` that is not an object, text after an unclosed block) is returned whole as
`content` with no tool_calls, and `malformed` says why: the agent sees what the model wrote, as
OpenAI and SGLang report it, and the episode goes on. A last block left unclosed (the model
stopped at end of turn, or a stop string ate `</tool_call>`) still parses, as SGLang's Hermes
parser allows.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ParsedReply:
    content: str
    tool_calls: list[dict] | None  # OpenAI's shape; None when the reply calls no tool
    malformed: str | None = None  # why a reply with a <tool_call> marker was not parsed

    @property
    def finish_reason(self) -> str | None:
        """ "tool_calls" when the reply calls tools (replaces a "stop"), else None."""
        return "tool_calls" if self.tool_calls else None


def parse_reply(text: str, tool_names: set[str] | None) -> ParsedReply:
    """Split `text` into content and tool calls of the tools named in `tool_names`; with no
    tools offered, nothing is parsed."""
    if not tool_names or OPEN not in text:
        return ParsedReply(text, None)
    calls, pieces, pos = [], [], 0
    while (start := text.find(OPEN, pos)) >= 0:
        pieces.append(text[pos:start])
        end = text.find(CLOSE, start)
        raw = text[start + len(OPEN) :] if end < 0 else text[start + len(OPEN) : end]
        call, why = _parse_call(raw, tool_names)
        if why is not None:
            return ParsedReply(text, None, f"tool call {len(calls) + 1}: {why}")
        calls.append(call)
        if end < 0:
            pos = len(text)
            break
        pos = end + len(CLOSE)
    pieces.append(text[pos:])
    return ParsedReply("".join(pieces).strip(), calls)


def _parse_call(raw: str, tool_names: set[str]) -> tuple[dict | None, str | None]:
    try:
        obj = json.loads(raw.strip())
    except ValueError as exc:
        return None, f"invalid JSON ({exc})"
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object with 'name' and 'arguments'"
    name = obj.get("name")
    if not isinstance(name, str):
        return None, "no 'name' string"
    if name not in tool_names:
        return None, f"unknown tool {name!r} (offered: {sorted(tool_names)})"
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return None, f"'arguments' of {name!r} is not an object"
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }, None
