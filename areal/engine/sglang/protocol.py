"""SGLang's HTTP API as pure functions: build request bodies, parse response bodies.

This is the one module that knows SGLang's wire format (checked against SGLang 0.5.2's and 0.5.23's
`entrypoints/http_server.py` and `managers/io_struct.py`); the clients (`control.py` for control
routes, `client.py` for /generate) only send what it builds. Why a fixed key set: SGLang silently
ignores unknown top-level keys of /generate (a typo such as `max_tokens` would vanish without a
trace) and answers an unknown sampling key with HTTP 500, so every payload here is spelt from the
constants below and tested on saved JSON.

Wire facts the parsers rely on:
* `meta_info.output_token_logprobs` is a list of `[logprob, token_id, text_or_null]` triples.
* `output_ids` keep a matched stop token (EOS or a stop_token_id); its logprob is reported too.
* `meta_info.finish_reason` is `{"type": "stop", "matched": int|str}`,
  `{"type": "length", "length": n}`, `{"type": "abort", "message": ...}`, or null (streaming).
  A request aborted before prefill comes back without `output_ids`.
* `meta_info.weight_version` is a string ("default" until a weight update passes a version); the
  server's current one is `weight_version` in GET /model_info (/get_model_info before 0.5.10;
  the older /get_weight_version route is gone from SGLang 0.5.9 on).
* /release_memory_occupation and /resume_memory_occupation answer 200 with an empty body.
* GET /v1/loads answers {"loads": [{"dp_rank", "num_running_reqs", "num_waiting_reqs", ...}, ...]},
  one entry per data-parallel scheduler, from a snapshot each scheduler publishes every
  `--load-snapshot-publish-interval` (15) decode steps and at once after a prefill or when idle.
* The built-in server (areal/server) also sends `meta_info.output_version_spans`,
  `[[start, version], ...]`: the version each stretch of output tokens came from. SGLang does not.
* With `"stream": true` the answer is server-sent events, `data: {...}` then `data: [DONE]`, a
  chunk every `sampling_params.stream_interval` tokens and one at the end (finish_reason set).
  Each chunk's `meta_info.completion_tokens` counts the tokens so far and `weight_version` is the
  server's as it sends the chunk (SGLang: tokenizer_manager._handle_batch_output). A chunk holds
  the whole output so far, or only its new tokens under SGLang's --incremental-streaming-output.
  A request that fails mid-stream ends with `data: {"error": {...}}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from areal.api.inference import ModelRequest
from areal.api.weights import WeightUpdateMeta
from areal.infra.pause import PAUSE_MODES
from areal.infra.sglang_keys import MEMORY_TAGS, SAMPLING_KEYS  # shared with the built-in server

# Routes used by the client.
GENERATE = "/generate"
HEALTH = "/health"
SERVER_INFO = "/server_info"
SERVER_INFO_LEGACY = "/get_server_info"  # the same answer; deprecated in SGLang 0.5.16 (logged at each call)
MODEL_INFO = "/model_info"
MODEL_INFO_LEGACY = "/get_model_info"  # the same answer; the only name before SGLang 0.5.10
FLUSH_CACHE = "/flush_cache"
PAUSE = "/pause_generation"
CONTINUE = "/continue_generation"
ABORT = "/abort_request"  # answers 200 with an empty body
UPDATE_FROM_DISK = "/update_weights_from_disk"
UPDATE_WEIGHT_VERSION = "/update_weight_version"
LOAD_LORA = "/load_lora_adapter"
UNLOAD_LORA = "/unload_lora_adapter"
INIT_GROUP = "/init_weights_update_group"
UPDATE_FROM_DISTRIBUTED = "/update_weights_from_distributed"
DESTROY_GROUP = "/destroy_weights_update_group"
UPDATE_FROM_TENSOR = "/update_weights_from_tensor"
RELEASE_MEMORY = "/release_memory_occupation"
RESUME_MEMORY = "/resume_memory_occupation"
START_PROFILE = "/start_profile"  # answers 200 with plain text; a refusal is an HTTP error
STOP_PROFILE = "/stop_profile"  # answers once the trace is written
LOADS = "/v1/loads?include=core"  # each scheduler's load snapshot (SGLang 0.5.16: every 15 decode steps)

# Every key the client may send, exactly as SGLang spells it (sampling keys: SAMPLING_KEYS).
GENERATE_KEYS = frozenset({"input_ids", "sampling_params", "rid", "return_logprob", "stream", "lora_path", "extra_key"})
PAUSE_KEYS = frozenset({"mode"})
DISK_UPDATE_KEYS = frozenset({"model_path", "weight_version", "abort_all_requests", "flush_cache"})
LOAD_LORA_KEYS = frozenset({"lora_name", "lora_path"})
WEIGHT_VERSION_KEYS = frozenset({"new_version", "abort_all_requests"})
PROFILE_KEYS = frozenset({"output_dir", "activities", "with_stack", "record_shapes", "profile_id"})
INIT_GROUP_KEYS = frozenset({"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"})
DISTRIBUTED_UPDATE_KEYS = frozenset(
    {"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests", "weight_version"}
)
DESTROY_GROUP_KEYS = frozenset({"group_name"})
TENSOR_UPDATE_KEYS = frozenset(
    {"serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests", "weight_version"}
)
MEMORY_KEYS = frozenset({"tags"})

StopReason = Literal["stop", "length", "abort"]


class ProtocolError(ValueError):
    """A response that does not have SGLang's shape (wrong server, proxy page, version skew)."""


@dataclass(frozen=True)
class GenerateResult:
    """One /generate answer: the tokens of this round and why it ended."""

    output_ids: list[int]
    output_logprobs: list[float]
    stop_reason: StopReason
    weight_version: int | None  # None when the server reports a non-integer ("default")
    message: str = ""  # abort message, for logs
    # per output token, from output_version_spans when the server sends them (None: it does not)
    output_versions: list[int | None] | None = None


def generate_payload(
    req: ModelRequest,
    *,
    rid: str,
    input_ids: list[int],
    max_new_tokens: int,
    min_new_tokens: int,
    lora_path: str | None = None,
    cache_namespace: str | None = None,
    stream_interval: int | None = None,
) -> dict[str, Any]:
    """The /generate body of one round of `req`; `lora_path` names the LoRA adapter to serve it
    with (SGLang applies an adapter only to requests that name it); `cache_namespace` becomes
    SGLang's `extra_key`, the namespace of the prefix cache this request may read and fill
    (areal.infra.pause: one namespace per weight version); `stream_interval` asks for the answer
    streamed in chunks of that many tokens (parse_generate_stream reads it).

    `rid`, `input_ids`, `max_new_tokens` and `min_new_tokens` are per round: a resubmission after
    an abort sends the prompt plus the tokens so far and the remaining budget, under a new rid
    (a server may still hold the aborted one).
    """
    sampling = {
        "max_new_tokens": int(max_new_tokens),
        "min_new_tokens": int(min_new_tokens),
        "temperature": float(req.temperature),
        "top_p": float(req.top_p),
        "top_k": int(req.top_k),
        "stop": list(req.stop),
        "stop_token_ids": [int(t) for t in req.stop_token_ids],
        "ignore_eos": bool(req.ignore_eos),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if req.sampling_seed is not None:
        sampling["sampling_seed"] = int(req.sampling_seed)
    if stream_interval is not None:
        sampling["stream_interval"] = int(stream_interval)
    body = {
        "input_ids": [int(t) for t in input_ids],
        "sampling_params": sampling,
        "rid": rid,
        "return_logprob": True,
        "stream": stream_interval is not None,
    }
    if lora_path is not None:
        body["lora_path"] = lora_path
    if cache_namespace is not None:
        body["extra_key"] = cache_namespace
    _check_keys(body, GENERATE_KEYS, GENERATE)
    _check_keys(sampling, SAMPLING_KEYS, GENERATE + " sampling_params")
    return body


def parse_generate(body: Any) -> GenerateResult:
    """Tokens, logprobs, stop reason and weight version of a /generate response body."""
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise ProtocolError(f"/generate answered without meta_info: {_short(body)}")
    meta = body["meta_info"]
    reason = meta.get("finish_reason")
    stop_reason = _stop_reason(reason)
    triples = meta.get("output_token_logprobs") or []
    output_ids = [int(t) for t in body.get("output_ids") or []]
    logprobs = [float(t[0]) for t in triples]
    if len(logprobs) != len(output_ids):
        raise ProtocolError(
            f"/generate returned {len(output_ids)} output_ids but {len(logprobs)} logprobs "
            "(was return_logprob dropped?)"
        )
    ids_in_triples = [int(t[1]) for t in triples]
    if ids_in_triples != output_ids:
        raise ProtocolError("/generate: token ids in output_token_logprobs differ from output_ids")
    message = reason.get("message", "") if isinstance(reason, dict) else ""
    return GenerateResult(
        output_ids,
        logprobs,
        stop_reason,
        parse_weight_version(meta.get("weight_version")),
        str(message or ""),
        _versions_from_spans(meta.get("output_version_spans"), len(output_ids)),
    )


def parse_generate_stream(chunks: list[Any]) -> GenerateResult:
    """One streamed /generate answer from its chunks, in order. Tokens are labelled with the
    version of the chunk that brought them (a chunk brings the tokens past the previous chunk's
    count), unless the server sent output_version_spans (the built-in server's exact labels)."""
    if not chunks:
        raise ProtocolError("/generate: the stream ended without a chunk")
    for chunk in chunks:
        if isinstance(chunk, dict) and "error" in chunk:
            raise ProtocolError(f"/generate: the stream ended with an error: {_short(chunk['error'])}")
        if not isinstance(chunk, dict) or not isinstance(chunk.get("meta_info"), dict):
            raise ProtocolError(f"/generate streamed a chunk without meta_info: {_short(chunk)}")
    last = chunks[-1]
    counts = [int(c["meta_info"].get("completion_tokens", len(c.get("output_ids") or []))) for c in chunks]
    if any(a > b for a, b in zip(counts, counts[1:])):
        raise ProtocolError(f"/generate: streamed completion_tokens went down: {_short(counts)}")
    if len(last.get("output_ids") or []) != counts[-1]:  # --incremental-streaming-output: join the parts
        last = _joined(chunks)
    result = parse_generate(last)
    if result.output_versions is not None:
        return result
    versions: list[int | None] = []
    for chunk, count in zip(chunks, counts):
        versions += [parse_weight_version(chunk["meta_info"].get("weight_version"))] * (count - len(versions))
    return GenerateResult(
        result.output_ids, result.output_logprobs, result.stop_reason, result.weight_version, result.message, versions
    )


def _joined(chunks: list[dict]) -> dict:
    """The whole answer from incremental chunks (each holds only its new tokens and logprobs)."""
    ids: list[int] = []
    triples: list[Any] = []
    for chunk in chunks:
        ids += chunk.get("output_ids") or []
        triples += chunk["meta_info"].get("output_token_logprobs") or []
    meta = {**chunks[-1]["meta_info"], "output_token_logprobs": triples}
    return {**chunks[-1], "output_ids": ids, "meta_info": meta}


def _versions_from_spans(spans: Any, n_tokens: int) -> list[int | None] | None:
    """Per-token versions from `[[start, version], ...]` (starts ascending from 0)."""
    if spans is None:
        return None
    if (
        not isinstance(spans, list)
        or not spans
        or not all(isinstance(s, list) and len(s) == 2 and isinstance(s[0], int) for s in spans)
        or spans[0][0] != 0
        or any(a[0] >= b[0] for a, b in zip(spans, spans[1:]))
    ):
        raise ProtocolError(
            f"/generate: output_version_spans {_short(spans)} are not "
            "[[start, version], ...] with starts ascending from 0"
        )
    versions: list[int | None] = []
    ends = [start for start, _ in spans[1:]] + [n_tokens]
    for (start, version), end in zip(spans, ends):
        versions += [parse_weight_version(version)] * max(0, min(end, n_tokens) - start)
    return versions


def _stop_reason(reason: Any) -> StopReason:
    if reason is None:
        raise ProtocolError(
            "/generate answered an unfinished request (finish_reason null): a whole answer, or a "
            "stream's last chunk, must be finished"
        )
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind not in ("stop", "length", "abort"):
        raise ProtocolError(f"/generate: unknown finish_reason {reason!r}")
    return kind


def parse_weight_version(value: Any) -> int | None:
    """SGLang reports versions as strings; ours are integers. Anything else ("default") is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def pause_payload(mode: str) -> dict[str, Any]:
    """/pause_generation needs a JSON body; mode is abort (default), retract or in_place."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode {mode!r} is not one of {PAUSE_MODES}; set rollout.pause_mode")
    return {"mode": mode}


def abort_all_payload() -> dict[str, Any]:
    """/abort_request for every request the server holds (SGLang's AbortReq: rid, abort_all)."""
    return {"abort_all": True}


def continue_payload() -> dict[str, Any]:
    """/continue_generation needs a JSON body, an empty one."""
    return {}


def flush_route(timeout_s: float) -> str:
    """/flush_cache, asked separately after a weight update (never by the update itself: SGLang's
    scheduler asserts when a flush it was asked for inside an update is refused, and refuses while
    any request waits or runs). It answers 200 when flushed and 400 while requests are pending; from
    SGLang 0.5.16 on, `timeout` lets the server wait that long for them to drain first."""
    return f"{FLUSH_CACHE}?timeout={float(timeout_s):g}"


def disk_update_payload(path: str, version: int | None) -> dict[str, Any]:
    """/update_weights_from_disk: reload `path`; the version only changes when one is passed.
    Weight updates never ask the server to flush (flush_cache false): see flush_route."""
    body: dict[str, Any] = {"model_path": str(path), "abort_all_requests": False, "flush_cache": False}
    if version is not None:
        body["weight_version"] = str(version)
    _check_keys(body, DISK_UPDATE_KEYS, UPDATE_FROM_DISK)
    return body


def load_lora_payload(name: str, path: str) -> dict[str, Any]:
    """/load_lora_adapter: load the peft adapter folder `path` under `name`."""
    body = {"lora_name": name, "lora_path": path}
    _check_keys(body, LOAD_LORA_KEYS, LOAD_LORA)
    return body


def unload_lora_payload(name: str) -> dict[str, Any]:
    return {"lora_name": name}


def weight_version_payload(version: int) -> dict[str, Any]:
    """/update_weight_version without aborting requests (an adapter load does not set one)."""
    body = {"new_version": str(version), "abort_all_requests": False}
    _check_keys(body, WEIGHT_VERSION_KEYS, UPDATE_WEIGHT_VERSION)
    return body


def init_group_payload(meta: WeightUpdateMeta, *, rank_offset: int, world_size: int) -> dict[str, Any]:
    """/init_weights_update_group for one server: its ranks start at `rank_offset`.

    Rank 0 is the trainer; server i with tensor parallel tp owns ranks 1 + i*tp .. (i+1)*tp.
    """
    body = {
        "master_address": meta.master_address,
        "master_port": int(meta.master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": meta.group_name,
        "backend": meta.backend,
    }
    _check_keys(body, INIT_GROUP_KEYS, INIT_GROUP)
    return body


def distributed_update_payload(meta: WeightUpdateMeta) -> dict[str, Any]:
    """/update_weights_from_distributed: names, dtypes and shapes of the tensors the trainer broadcasts."""
    if not (len(meta.names) == len(meta.dtypes) == len(meta.shapes)):
        raise ValueError(
            f"WeightUpdateMeta: {len(meta.names)} names, {len(meta.dtypes)} dtypes and "
            f"{len(meta.shapes)} shapes; they must match one to one"
        )
    body: dict[str, Any] = {
        "names": list(meta.names),
        "dtypes": list(meta.dtypes),
        "shapes": [list(map(int, s)) for s in meta.shapes],
        "group_name": meta.group_name,
        "flush_cache": False,  # see flush_route
        "abort_all_requests": False,
    }
    if meta.version is not None:
        body["weight_version"] = str(meta.version)
    _check_keys(body, DISTRIBUTED_UPDATE_KEYS, UPDATE_FROM_DISTRIBUTED)
    return body


def destroy_group_payload(group_name: str) -> dict[str, Any]:
    body = {"group_name": group_name}
    _check_keys(body, DESTROY_GROUP_KEYS, DESTROY_GROUP)
    return body


def tensor_update_payload(serialized: list[str], *, version: int | None) -> dict[str, Any]:
    """/update_weights_from_tensor: `serialized` holds one base64 text per tensor-parallel rank
    of the server (each a pickled list of (name, tensor) pairs made with torch's multiprocessing
    reductions: CUDA tensors travel as IPC handles; see areal/utils/tensor_ipc.py). The version
    changes only when one is passed; the server is never asked to flush (see flush_route)."""
    if not serialized or not all(isinstance(s, str) for s in serialized):
        raise ValueError("tensor_update_payload needs one serialized text per tensor-parallel rank")
    body: dict[str, Any] = {
        "serialized_named_tensors": list(serialized),
        "load_format": None,
        "flush_cache": False,
        "abort_all_requests": False,
    }
    if version is not None:
        body["weight_version"] = str(version)
    _check_keys(body, TENSOR_UPDATE_KEYS, UPDATE_FROM_TENSOR)
    return body


def memory_payload(tags: list[str] | None, route: str = RELEASE_MEMORY) -> dict[str, Any]:
    """/release_memory_occupation and /resume_memory_occupation: `tags` among MEMORY_TAGS, or
    None for all the server has (SGLang's meaning of a missing list, which on SGLang includes its
    cuda_graph tag)."""
    if tags is not None:
        bad = [t for t in tags if t not in MEMORY_TAGS]
        if bad or not tags:
            raise ValueError(
                f"{route}: tags {list(tags)!r} must be a non-empty subset of {list(MEMORY_TAGS)}, or None for all"
            )
    body = {"tags": None if tags is None else list(tags)}
    _check_keys(body, MEMORY_KEYS, route)
    return body


def start_profile_payload(output_dir: str, profile_id: str, *, with_stack: bool, record_shapes: bool) -> dict[str, Any]:
    """/start_profile until /stop_profile, CPU and GPU. with_stack and record_shapes are always sent:
    SGLang turns both on when they are missing, which makes traces large and steps slow."""
    body = {
        "output_dir": output_dir,
        "activities": ["CPU", "GPU"],
        "with_stack": bool(with_stack),
        "record_shapes": bool(record_shapes),
        "profile_id": profile_id,
    }
    _check_keys(body, PROFILE_KEYS, START_PROFILE)
    return body


def parse_model_info_version(body: Any) -> int | None:
    """The integer weight version in a /model_info answer (None: "default", or none given)."""
    if not isinstance(body, dict):
        raise ProtocolError(f"{MODEL_INFO} answered {_short(body)}, not a JSON object")
    return parse_weight_version(body.get("weight_version"))


def parse_loads(body: Any) -> int | None:
    """Requests running or waiting on a server, over its schedulers, from GET /v1/loads; None
    when the answer is not that shape."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    total = 0
    for load in loads:
        if not isinstance(load, dict):
            return None
        running, waiting = load.get("num_running_reqs"), load.get("num_waiting_reqs")
        if not isinstance(running, int) or not isinstance(waiting, int):
            return None
        total += running + waiting
    return total


def parse_success(route: str, body: Any) -> str:
    """Weight routes answer {"success": bool, "message": str} (LoRA routes: "error_message");
    returns the message or raises."""
    if not isinstance(body, dict) or "success" not in body:
        raise ProtocolError(f"{route} answered without 'success': {_short(body)}")
    if not body["success"]:
        raise RuntimeError(f"{route} failed: {body.get('message') or body.get('error_message', '')}")
    return str(body.get("message", ""))


def _check_keys(body: dict, allowed: frozenset[str], where: str) -> None:
    unknown = set(body) - allowed
    assert not unknown, f"{where}: keys {sorted(unknown)} are not in the tested key set"


def _short(body: Any, limit: int = 300) -> str:
    text = repr(body)
    return text if len(text) <= limit else text[:limit] + "..."
