"""Chat messages (and tools) to prompt text with the tokenizer's chat template.

Messages arrive in OpenAI's shape and are prepared for templates as SGLang prepares them:
content given as a list of text parts becomes one string, a null content becomes "", and an
assistant tool call's `arguments` (a JSON string in OpenAI's API) becomes the object it
encodes, which is what Qwen/Hermes-style templates serialise inside `<tool_call>`.

`chatml_tools` is a ChatML template with tools written for this project: the tools go into the
system turn, assistant tool calls render as `<tool_call>{"name": ..., "arguments": ...}
</tool_call>` (the format tool_calls.py parses) and tool results as a `tool` turn. The tiny
`tiny:chat` model uses it, and `workflow.agent.chat_template: chatml_tools` gives it to a model
whose own template ignores tools (SmolLM2-135M-Instruct's does).
"""

from __future__ import annotations

import json
from pathlib import Path

from areal.chat.request import RequestError

CHATML_TOOLS = r"""
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools or has_system %}
{{- '<|im_start|>system\n' }}
{%- if has_system %}{{- messages[0].content }}{% endif %}
{%- if tools %}
{%- if has_system %}{{- '\n\n' }}{% endif %}
{{- 'Tools you can call:\n<tools>' }}
{%- for tool in tools %}
{{- '\n' + ((tool.function if tool.function is defined else tool) | tojson) }}
{%- endfor %}
{{- '\n</tools>\nTo call a tool, reply with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{%- if message.content or not loop.first %}{{- '\n' }}{% endif %}
{{- '<tool_call>' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson) + '</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{% endif %}
""".strip()

BUILTIN_TEMPLATES = {"chatml_tools": CHATML_TOOLS}


def resolve_chat_template(spec: str, key: str = "workflow.agent.chat_template") -> str:
    """The Jinja text named by `spec`: a built-in name or the path of a template file."""
    if spec in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[spec]
    path = Path(spec).expanduser()
    if path.is_file():
        return path.read_text()
    raise ValueError(
        f"{key}={spec!r} is neither a built-in chat template "
        f"({', '.join(BUILTIN_TEMPLATES)}) nor an existing Jinja file; give one of them"
    )


def template_messages(messages: list[dict]) -> list[dict]:
    """Copies of OpenAI messages in the form chat templates read (see the module docstring)."""
    out = []
    for message in messages:
        m = dict(message)
        m["content"] = content_text(m.get("content"))
        if m.get("tool_calls"):
            m["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
        else:
            m.pop("tool_calls", None)
        out.append(m)
    return out


def content_text(content) -> str:
    """A message's content as one string: text parts joined, null as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] if isinstance(part, dict) else str(part) for part in content)


def _template_call(call: dict) -> dict:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError:
            pass  # a malformed call in the history renders as the string it is
    return {**call, "function": function}


def render_chat(
    tokenizer,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    template_kwargs: dict | None = None,
    chat_template: str | None = None,
) -> str:
    """The prompt text of `messages` (OpenAI shape); a template that refuses them is a
    RequestError (HTTP 400) carrying the template's message."""
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise RequestError(
            f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat "
            "template, so chat messages cannot be rendered; use /v1/completions "
            "with a prompt, or a model with a chat template"
        )
    kwargs = dict(template_kwargs or {})
    try:
        return tokenizer.apply_chat_template(
            template_messages(messages),
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            **kwargs,
        )
    except Exception as exc:  # jinja's TemplateError (raise_exception), or a TypeError inside
        raise RequestError(
            f"messages: the chat template cannot render them: {type(exc).__name__}: {exc}", param="messages"
        ) from None


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of rendered text: the template already holds the special tokens it wants."""
    # encode(), not __call__: the same ids without building a BatchEncoding, which under transformers 5
    # took 197 against 140 us for a GSM8K prompt, on the rollout thread that shares the trainer's GIL
    return list(tokenizer.encode(text, add_special_tokens=False))
