"""Validation of request bodies: turn JSON into typed values or raise `BadRequest` (HTTP 400).

SGLang silently ignores unknown top-level keys of /generate and answers an unknown sampling key
with HTTP 500. We answer both with HTTP 400 naming the key, because a misspelt parameter that is
silently dropped (e.g. `max_tokens` for `max_new_tokens`) corrupts an experiment without a trace.
Keys SGLang knows but this server does not implement are accepted only at their neutral value
(e.g. `frequency_penalty: 0`), so a client that always sends them keeps working.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from areal.infra.sglang_keys import SAMPLING_KEYS  # the sampling keys implemented here
from areal.server.sampling import SamplingParams


class BadRequest(ValueError):
    """A client error; its message goes back in the body, with HTTP status `status`."""

    status = 400


class Forbidden(BadRequest):
    """The request is well formed but asks for something this server may not do."""

    status = 403


class UnsupportedMediaType(BadRequest):
    status = 415


# SGLang sampling keys that are accepted only at the value that disables them.
NEUTRAL_SAMPLING = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
    "logit_bias": None,
    "spaces_between_special_tokens": True,
}
# SGLang top-level /generate keys accepted only at their neutral value.
NEUTRAL_TOP = {
    "logprob_start_len": -1,
    "top_logprobs_num": 0,
    "token_ids_logprob": None,
    "image_data": None,
    "video_data": None,
    "audio_data": None,
    "input_embeds": None,
    "custom_logit_processor": None,
    "return_hidden_states": False,
    "session_params": None,
    "modalities": None,
    "data_parallel_rank": None,
    "bootstrap_host": None,
    "bootstrap_port": None,
    "bootstrap_room": None,
}
# Top-level keys with no effect on results here (bookkeeping in SGLang).
IGNORED_TOP = {"log_metrics", "priority", "label", "conversation_id", "background"}
IMPLEMENTED_TOP = {
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "return_text_in_logprobs",
    "lora_path",
    "extra_key",  # SGLang's prefix-cache namespace; there is no prefix cache here
    "stream",  # server-sent events, one chunk every sampling_params.stream_interval tokens
}


@dataclass(frozen=True)
class GenerateInput:
    """A validated /generate request (one prompt)."""

    input_ids: list[int]
    sampling: SamplingParams
    rid: str | None
    return_logprob: bool
    return_text_in_logprobs: bool
    lora_path: str | None = None  # the LoRA adapter to serve it with (see lora.py)
    stream: bool = False
    stream_interval: int = 1  # tokens between streamed chunks (sampling_params.stream_interval)


def require_object(body: Any, route: str) -> dict:
    if not isinstance(body, dict):
        raise BadRequest(f"{route}: the body must be a JSON object, got {type(body).__name__}.")
    return body


def check_keys(body: dict, allowed: set[str], where: str) -> None:
    """Reject keys outside `allowed`, naming them and listing the accepted ones."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"{where}: unknown key(s) {unknown}; accepted keys are {sorted(allowed)}.")


def get_typed(body: dict, key: str, kind, default=None, where: str = "request"):
    """body[key] checked against `kind` (bool is not accepted as a number)."""
    value = body.get(key, default)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    is_bool = isinstance(value, bool)
    ok = isinstance(value, kinds) and (bool in kinds or not is_bool)
    if isinstance(value, float) and float in kinds and not math.isfinite(value):
        ok = False
    if not ok:
        names = "/".join(k.__name__ for k in kinds)
        raise BadRequest(f"{where}: '{key}' must be {names}, got {value!r}.")
    return value


def _check_neutral(body: dict, neutral: dict, where: str) -> None:
    for key, value in neutral.items():
        if key in body and body[key] is not None and body[key] != value:
            raise BadRequest(
                f"{where}: '{key}'={body[key]!r} is not supported by the built-in "
                f"server; omit it or use {value!r} (or run SGLang)."
            )


def _int_list(value, key: str, vocab_size: int, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequest(
            f"{where}: '{key}' must be a list of integers (one prompt; batched "
            "/generate is not supported by the built-in server)."
        )
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"{where}: '{key}' has token ids outside [0, {vocab_size}): {bad[:5]}.")
    return value


def parse_sampling(raw: Any, vocab_size: int) -> SamplingParams:
    """Validate `sampling_params` with SGLang's rules (SamplingParams.verify)."""
    where = "sampling_params"
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise BadRequest(f"'sampling_params' must be an object, got {type(raw).__name__}.")
    check_keys(raw, SAMPLING_KEYS | set(NEUTRAL_SAMPLING), where)
    _check_neutral(raw, NEUTRAL_SAMPLING, where)
    max_new = get_typed(raw, "max_new_tokens", int, 128, where)
    min_new = get_typed(raw, "min_new_tokens", int, 0, where)
    temperature = float(get_typed(raw, "temperature", (int, float), 1.0, where))
    top_p = float(get_typed(raw, "top_p", (int, float), 1.0, where))
    top_k = get_typed(raw, "top_k", int, -1, where)
    if max_new < 0:
        raise BadRequest(f"{where}: max_new_tokens must be >= 0, got {max_new}.")
    if not 0 <= min_new <= max_new:
        raise BadRequest(f"{where}: min_new_tokens must be in [0, max_new_tokens={max_new}], got {min_new}.")
    if temperature < 0:
        raise BadRequest(f"{where}: temperature must be >= 0, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise BadRequest(f"{where}: top_p must be in (0, 1], got {top_p}.")
    if top_k != -1 and top_k < 1:
        raise BadRequest(f"{where}: top_k must be -1 (disabled) or >= 1, got {top_k}.")
    stop = raw.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest(f"{where}: 'stop' must be a non-empty string or a list of them, got {stop!r}.")
    stop_ids = raw.get("stop_token_ids")
    stop_ids = [] if stop_ids is None else _int_list(stop_ids, "stop_token_ids", vocab_size, where)
    top_k = min(top_k, vocab_size)  # the same distribution; a huge k would overflow torch
    if temperature < 1e-6:  # SGLang: temperature 0 means greedy = (T=1, top_k=1)
        temperature, top_k = 1.0, 1
    return SamplingParams(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        stop=tuple(stop or ()),
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=get_typed(raw, "ignore_eos", bool, False, where),
        no_stop_trim=get_typed(raw, "no_stop_trim", bool, False, where),
        skip_special_tokens=get_typed(raw, "skip_special_tokens", bool, True, where),
        sampling_seed=get_typed(raw, "sampling_seed", int, None, where),
    )


def parse_generate(body: Any, *, vocab_size: int, context_length: int, tokenize) -> GenerateInput:
    """Validate a /generate body. `tokenize(text) -> ids`, or None without a tokenizer."""
    body = require_object(body, "/generate")
    check_keys(body, IMPLEMENTED_TOP | IGNORED_TOP | set(NEUTRAL_TOP), "/generate")
    _check_neutral(body, NEUTRAL_TOP, "/generate")
    get_typed(body, "extra_key", str, None, "/generate")  # checked, then ignored (no prefix cache)
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise BadRequest("/generate: give exactly one of 'text' or 'input_ids'.")
    if has_text:
        text = body["text"]
        if not isinstance(text, str):
            raise BadRequest(
                "/generate: 'text' must be a string (one prompt; batched /generate "
                "is not supported by the built-in server)."
            )
        if tokenize is None:
            raise BadRequest(
                "/generate: 'text' needs a tokenizer, but the server runs with --skip-tokenizer-init; send 'input_ids'."
            )
        input_ids = tokenize(text)
    else:
        input_ids = _int_list(body["input_ids"], "input_ids", vocab_size, "/generate")
    if not input_ids:
        raise BadRequest("/generate: the prompt is empty; send at least one token.")
    sampling = parse_sampling(body.get("sampling_params"), vocab_size)
    _check_length(len(input_ids), sampling.max_new_tokens, context_length)
    return GenerateInput(
        input_ids=list(input_ids),
        sampling=sampling,
        rid=get_typed(body, "rid", str, None, "/generate"),
        return_logprob=get_typed(body, "return_logprob", bool, False, "/generate"),
        return_text_in_logprobs=get_typed(body, "return_text_in_logprobs", bool, False, "/generate"),
        lora_path=get_typed(body, "lora_path", str, None, "/generate"),
        stream=get_typed(body, "stream", bool, False, "/generate"),
        stream_interval=_stream_interval(body.get("sampling_params")),
    )


def _stream_interval(raw: Any) -> int:
    """sampling_params.stream_interval: SGLang's per-request chunk spacing (null: the server's, 1)."""
    interval = get_typed(raw or {}, "stream_interval", int, 1, "sampling_params")
    if interval < 1:
        raise BadRequest(f"sampling_params: stream_interval must be >= 1, got {interval}.")
    return interval


def _check_length(n_input: int, max_new: int, context_length: int) -> None:
    """SGLang's rule: input < context and input + max_new_tokens < context."""
    if n_input >= context_length:
        raise BadRequest(
            f"The input ({n_input} tokens) is longer than the model's context "
            f"length ({context_length} tokens); shorten the prompt or raise "
            "--context-length."
        )
    if n_input + max_new >= context_length:
        raise BadRequest(
            f"Requested token count ({n_input} input + {max_new} new) exceeds the "
            f"model's context length ({context_length} tokens); lower "
            "max_new_tokens or raise --context-length."
        )
