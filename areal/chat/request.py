"""Validation of /v1/chat/completions and /v1/completions bodies into typed requests.

Fields follow OpenAI's API, plus SGLang's extensions that a trainer or a debugging user wants
(`top_k`, `min_tokens`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`, `no_stop_trim`,
`return_prompt_token_ids`, `return_token_ids`, `return_meta_info`, `chat_template_kwargs`,
`rid`). Any other top-level field is a 400 that names it: a misspelt parameter silently dropped
would change an experiment without a trace. OpenAI fields this stack cannot honour are accepted
only at the value that disables them (`seed: null`, `frequency_penalty: 0`, ...), and
`tool_choice` "required" or a named function is a 400: forcing a call needs constrained
decoding, which the built-in server does not have.

Messages may carry keys beyond role/content/tool_calls/tool_call_id/name (an agent that appends
`message.model_dump()` sends `refusal`, `audio`, ...): they reach the chat template untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
IGNORED = {"user", "metadata", "store", "service_tier"}  # bookkeeping with no effect on the output
# OpenAI / SGLang fields accepted only at the value that disables them
NEUTRAL = {
    "seed": None,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "logit_bias": None,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "response_format": None,
}
SAMPLING_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
}
EXTENSION_KEYS = {"return_prompt_token_ids", "return_token_ids", "return_meta_info", "rid"}
COMMON_KEYS = {"model", "n", "stream", "stream_options", "logprobs"} | SAMPLING_KEYS | EXTENSION_KEYS
CHAT_KEYS = COMMON_KEYS | {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_completion_tokens",
    "top_logprobs",
    "chat_template_kwargs",
}
COMPLETION_KEYS = COMMON_KEYS | {"prompt", "echo", "suffix", "best_of"}
MAX_N = 64


class RequestError(ValueError):
    """A client error: HTTP `status` with OpenAI's error body (message, type, param, code)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass(frozen=True)
class Sampling:
    """The sampling fields a request set (None: not given; the server or the run decides)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False


@dataclass(frozen=True)
class Extensions:
    """SGLang's extra outputs: prompt/response token ids and the generation's meta_info."""

    return_prompt_token_ids: bool = False
    return_token_ids: bool = False
    return_meta_info: bool = False
    rid: str | None = None


@dataclass(frozen=True)
class RequestOptions:
    """What a request to either endpoint carries besides its input (messages or a prompt)."""

    model: str
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    sampling: Sampling
    extensions: Extensions


@dataclass(frozen=True)
class ChatRequest(RequestOptions):
    messages: list[dict]
    tools: list[dict] | None
    tool_choice: str  # "auto" (parse tool calls) or "none"
    template_kwargs: dict = field(default_factory=dict)

    @property
    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice == "auto"

    @property
    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools or []}


@dataclass(frozen=True)
class CompletionRequest(RequestOptions):
    prompt: str | list[int]


def parse_chat_request(body: Any) -> ChatRequest:
    where = "/v1/chat/completions"
    body = _object(body, where)
    _check_keys(body, CHAT_KEYS, where)
    _check_neutral(body, where)
    top_logprobs = _typed(body, "top_logprobs", int, 0, where)
    if top_logprobs:
        raise RequestError(
            f"{where}: 'top_logprobs'={top_logprobs} is not supported: the servers "
            "return the logprob of the chosen token only; omit it or use 0 (with "
            "logprobs=true for the chosen tokens' logprobs).",
            param="top_logprobs",
        )
    tools = _tools(body.get("tools"), where)
    tool_choice = _tool_choice(body.get("tool_choice"), tools, where)
    if body.get("parallel_tool_calls") is False:
        raise RequestError(
            f"{where}: 'parallel_tool_calls'=false is not supported (the model may "
            "write several calls and nothing constrains it to one); omit it.",
            param="parallel_tool_calls",
        )
    _typed(body, "parallel_tool_calls", bool, True, where)
    max_tokens = _max_tokens(body, where)
    kwargs = _typed(body, "chat_template_kwargs", dict, {}, where)
    stream, include_usage = _stream(body, where)
    return ChatRequest(
        model=_typed(body, "model", str, "default", where),
        messages=_messages(body, where),
        tools=tools,
        tool_choice=tool_choice,
        n=_n(body, where),
        stream=stream,
        include_usage=include_usage,
        logprobs=_typed(body, "logprobs", bool, False, where),
        sampling=_sampling(body, max_tokens, where),
        extensions=_extensions(body, stream, where),
        template_kwargs=kwargs,
    )


def parse_completion_request(body: Any) -> CompletionRequest:
    where = "/v1/completions"
    body = _object(body, where)
    _check_keys(body, COMPLETION_KEYS, where)
    _check_neutral(body, where)
    if body.get("echo"):
        raise RequestError(
            f"{where}: 'echo'=true is not supported; omit it (return_token_ids gives the prompt's token ids).",
            param="echo",
        )
    if body.get("suffix"):
        raise RequestError(f"{where}: 'suffix' is not supported (no fill-in-the-middle); omit it.", param="suffix")
    n = _n(body, where)
    best_of = _typed(body, "best_of", int, None, where)
    if best_of not in (None, n):
        raise RequestError(
            f"{where}: 'best_of'={best_of} is not supported (no ranking of samples); omit it or set it to n ({n}).",
            param="best_of",
        )
    logprobs = _typed(body, "logprobs", int, None, where)
    if logprobs:
        raise RequestError(
            f"{where}: 'logprobs'={logprobs} asks for top-{logprobs} alternatives, "
            "which the servers do not return; use logprobs=0 for the chosen "
            "tokens' logprobs.",
            param="logprobs",
        )
    stream, include_usage = _stream(body, where)
    return CompletionRequest(
        model=_typed(body, "model", str, "default", where),
        prompt=_prompt(body, where),
        n=n,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs == 0,
        sampling=_sampling(body, _typed(body, "max_tokens", int, 16, where), where),
        extensions=_extensions(body, stream, where),
    )


# ---- pieces -------------------------------------------------------------------------------------


def _object(body: Any, where: str) -> dict:
    if not isinstance(body, dict):
        raise RequestError(f"{where}: the body must be a JSON object, got {type(body).__name__}.")
    return body


def _check_keys(body: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(body) - allowed - IGNORED - set(NEUTRAL))
    if unknown:
        raise RequestError(
            f"{where}: unknown field(s) {unknown}; accepted fields are {sorted(allowed | set(NEUTRAL))}.",
            param=unknown[0],
        )


def _check_neutral(body: dict, where: str) -> None:
    for key, neutral in NEUTRAL.items():
        value = body.get(key)
        if value is None or value == neutral or (key == "logit_bias" and value == {}):
            continue
        if key == "response_format" and value == {"type": "text"}:
            continue
        raise RequestError(f"{where}: '{key}'={value!r} is not supported here; omit it or use {neutral!r}.", param=key)


def _typed(body: dict, key: str, kind, default, where: str):
    """body[key] checked against `kind` (a bool is not a number); null means the default."""
    value = body.get(key)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        names = " or ".join(k.__name__ for k in kinds)
        raise RequestError(f"{where}: '{key}' must be {names}, got {value!r}.", param=key)
    return value


def _n(body: dict, where: str) -> int:
    n = _typed(body, "n", int, 1, where)
    if not 1 <= n <= MAX_N:
        raise RequestError(f"{where}: 'n' must be in [1, {MAX_N}], got {n}.", param="n")
    return n


def _stream(body: dict, where: str) -> tuple[bool, bool]:
    stream = _typed(body, "stream", bool, False, where)
    options = _typed(body, "stream_options", dict, None, where)
    if options is None:
        return stream, False
    if not stream:
        raise RequestError(f"{where}: 'stream_options' is only allowed with stream=true.", param="stream_options")
    _check_keys(options, {"include_usage"}, f"{where} stream_options")
    return stream, _typed(options, "include_usage", bool, False, f"{where} stream_options")


def _max_tokens(body: dict, where: str) -> int | None:
    legacy = _typed(body, "max_tokens", int, None, where)
    new = _typed(body, "max_completion_tokens", int, None, where)
    if legacy is not None and new is not None and legacy != new:
        raise RequestError(
            f"{where}: 'max_tokens'={legacy} and 'max_completion_tokens'={new} disagree; give one of them.",
            param="max_completion_tokens",
        )
    return new if new is not None else legacy


def _sampling(body: dict, max_tokens: int | None, where: str) -> Sampling:
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"{where}: the token budget must be >= 1, got {max_tokens}.", param="max_tokens")
    temperature = _typed(body, "temperature", (int, float), None, where)
    if temperature is not None and not 0 <= temperature <= 2:
        raise RequestError(f"{where}: 'temperature' must be in [0, 2], got {temperature}.", param="temperature")
    top_p = _typed(body, "top_p", (int, float), None, where)
    if top_p is not None and not 0 < top_p <= 1:
        raise RequestError(f"{where}: 'top_p' must be in (0, 1], got {top_p}.", param="top_p")
    top_k = _typed(body, "top_k", int, None, where)
    if top_k is not None and top_k != -1 and top_k < 1:
        raise RequestError(f"{where}: 'top_k' must be -1 (off) or >= 1, got {top_k}.", param="top_k")
    min_tokens = _typed(body, "min_tokens", int, 0, where)
    if min_tokens < 0 or (max_tokens is not None and min_tokens > max_tokens):
        raise RequestError(f"{where}: 'min_tokens' must be in [0, max_tokens], got {min_tokens}.", param="min_tokens")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise RequestError(f"{where}: 'stop' must be a non-empty string or a list of them, got {stop!r}.", param="stop")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not (
        isinstance(stop_ids, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_ids)
    ):
        raise RequestError(
            f"{where}: 'stop_token_ids' must be a list of token ids, got {stop_ids!r}.", param="stop_token_ids"
        )
    return Sampling(
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p),
        top_k=top_k,
        min_tokens=min_tokens,
        stop=tuple(stop or ()),
        stop_token_ids=tuple(stop_ids or ()),
        ignore_eos=_typed(body, "ignore_eos", bool, False, where),
        skip_special_tokens=_typed(body, "skip_special_tokens", bool, True, where),
        no_stop_trim=_typed(body, "no_stop_trim", bool, False, where),
    )


def _extensions(body: dict, stream: bool, where: str) -> Extensions:
    ext = Extensions(
        return_prompt_token_ids=_typed(body, "return_prompt_token_ids", bool, False, where),
        return_token_ids=_typed(body, "return_token_ids", bool, False, where),
        return_meta_info=_typed(body, "return_meta_info", bool, False, where),
        rid=_typed(body, "rid", str, None, where),
    )
    asked = [k for k in ("return_prompt_token_ids", "return_token_ids", "return_meta_info") if getattr(ext, k)]
    if stream and asked:
        raise RequestError(f"{where}: {asked} need stream=false (as in SGLang).", param=asked[0])
    return ext


def _messages(body: dict, where: str) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(f"{where}: 'messages' must be a non-empty list of messages.", param="messages")
    return [_message(m, i, where) for i, m in enumerate(messages)]


def _message(message: Any, i: int, where: str) -> dict:
    at = f"{where}: messages[{i}]"
    if not isinstance(message, dict):
        raise RequestError(f"{at} must be an object, got {type(message).__name__}.", param="messages")
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{at}.role={role!r} is not one of {list(ROLES)}.", param="messages")
    out = dict(message)
    out["role"] = "system" if role == "developer" else role  # templates know system, not developer
    content = message.get("content")
    if isinstance(content, list):
        kinds = sorted({p.get("type") for p in content if isinstance(p, dict)} - {"text"})
        if kinds or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
            raise RequestError(
                f"{at}.content: only text parts are supported, got part types {kinds or 'without text'}.",
                param="messages",
            )
    elif content is None:
        if not (role == "assistant" and message.get("tool_calls")):
            raise RequestError(
                f"{at}.content is required (only an assistant message with tool_calls may leave it null).",
                param="messages",
            )
    elif not isinstance(content, str):
        raise RequestError(f"{at}.content must be a string or a list of text parts.", param="messages")
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise RequestError(f"{at}: only assistant messages carry tool_calls.", param="messages")
        out["tool_calls"] = [
            _history_call(c, f"{at}.tool_calls[{k}]")
            for k, c in enumerate(_list(message["tool_calls"], f"{at}.tool_calls"))
        ]
    return out


def _history_call(call: Any, at: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(
            f"{at} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}, got {call!r}.",
            param="messages",
        )
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, (str, dict)):
        raise RequestError(f"{at}.function.arguments must be a JSON string, got {arguments!r}.", param="messages")
    return {"id": call.get("id"), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _list(value: Any, at: str) -> list:
    if not isinstance(value, list):
        raise RequestError(f"{at} must be a list, got {type(value).__name__}.", param="messages")
    return value


def _tools(tools: Any, where: str) -> list[dict] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise RequestError(f"{where}: 'tools' must be a list of tools.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (
            isinstance(tool, dict)
            and tool.get("type", "function") == "function"
            and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and function["name"]
        ):
            raise RequestError(
                f"{where}: tools[{i}] must be {{'type': 'function', 'function': "
                f"{{'name': ..., 'parameters': ...}}}}, got {tool!r}.",
                param="tools",
            )
        out.append({"type": "function", "function": dict(function)})
    return out


def _tool_choice(choice: Any, tools: list[dict] | None, where: str) -> str:
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("auto", "none"):
        return choice
    if choice == "required" or isinstance(choice, dict):
        raise RequestError(
            f"{where}: 'tool_choice'={choice!r} is not supported: forcing a call "
            "needs constrained decoding, which these servers lack; use 'auto' (the "
            "model's <tool_call> blocks are parsed) or 'none'.",
            param="tool_choice",
        )
    raise RequestError(f"{where}: 'tool_choice' must be 'auto' or 'none', got {choice!r}.", param="tool_choice")


def _prompt(body: dict, where: str) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return prompt
    raise RequestError(
        f"{where}: 'prompt' must be one non-empty string or one list of token ids "
        "(batched prompts are not supported; send one request per prompt).",
        param="prompt",
    )
