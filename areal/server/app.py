"""HTTP routes (aiohttp) with SGLang's paths, request fields and response shapes.

Request bodies are validated here (see `validation.py`); the model work happens on the
scheduler's worker thread, and handlers await its futures, so the event loop stays responsive
(health checks, aborts and pauses are answered while a batch is decoding).

Error bodies follow SGLang: `{"error": {"message": ...}}` with HTTP 400 for client errors,
404/405 for unknown routes/methods, 401 without the API key, 500 for internal failures. Beyond
SGLang: 413 for a body larger than any valid request (`max_body_bytes`), 415 for a body sent with
a non-JSON Content-Type, 503 when --max-running-requests + --max-queued-requests /generate
requests are already in the server, and 403 (weights shape `{"success": false, "message"}`) for
a disk weight or LoRA adapter load from outside the allowed folders (--weight-dirs). LoRA
adapters: see lora.py (one adapter served at a time, merged into the weights).

Colocation with a trainer on the same GPU (SGLang's routes): /update_weights_from_tensor takes
tensors the trainer shares (CUDA IPC handles or CPU shared memory; weights.py, and
areal/utils/tensor_ipc.py for the format), and /release_memory_occupation and
/resume_memory_occupation give the KV cache and the weights back to the device and take them
again (memory.py, which also keeps the server within --mem-fraction-static). While memory is
released, /generate is a 400 that names /resume_memory_occupation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

from aiohttp import web

from areal.infra.pause import PAUSE_MODES
from areal.infra.sglang_keys import MEMORY_TAGS
from areal.server.bodies import error, max_body_bytes, read_json
from areal.server.connections import close_connections_when_files_run_short
from areal.server.memory import (
    DeviceMemoryShort,
    KVBudget,
    MemoryOccupation,
    MemoryReleased,
    ServerBusy,
    memory_readings,
    released_message,
)
from areal.server.openai_api import add_openai_routes
from areal.server.sampling import SamplingParams
from areal.server.scheduler import Scheduler, Sequence
from areal.server.validation import (
    BadRequest,
    check_keys,
    get_typed,
    parse_generate,
)
from areal.server.weights import WeightUpdater, check_weight_path

logger = logging.getLogger("areal.server")
TENSOR_LOAD_FORMATS = (None, "direct")  # both: copy by Hugging Face state-dict name
TENSOR_SELECTORS = ("all", "target")  # no draft model here
HEALTH_GENERATE_TIMEOUT_S = 20.0


@dataclass
class ServerState:
    """Everything the handlers share; one per server process."""

    args: object
    runner: object
    tokenizer: object | None
    scheduler: Scheduler
    updater: WeightUpdater
    context_length: int
    weight_version: str
    eos_ids: set[int]
    weight_roots: list[str] = field(default_factory=list)  # see weights.weight_roots
    memory: MemoryOccupation | None = None  # release/resume; see memory.py
    kv_budget: KVBudget | None = None  # how max_total_num_tokens was reached
    accepted: int = 0  # /generate requests inside the server (held, queued or running)
    accept_out_of_files: int = 0  # accept() failures for want of descriptors (connections.py)
    open_connections: Callable[[], int] | None = None  # connections the HTTP server holds (set by serve())
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set = not paused
    lora_ops: int = 0  # LoRA loads/unloads in progress; requests naming an adapter wait for them
    lora_idle: asyncio.Event = field(default_factory=asyncio.Event)  # set = lora_ops == 0
    inflight: dict[str, Sequence] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def __post_init__(self):
        self.gate.set()
        self.lora_idle.set()

    @property
    def capacity(self) -> int:
        return self.args.max_running_requests + self.args.max_queued_requests


def build_app(state: ServerState) -> web.Application:
    app = web.Application(
        middlewares=[_error_middleware, _auth_middleware(state.args.api_key)],
        client_max_size=max_body_bytes(state.context_length),
    )
    app["state"] = state
    app.on_response_prepare.append(close_connections_when_files_run_short)  # connections.py
    h = Handlers(state)
    add = app.router.add_route
    for path, handler in (
        ("/health", h.health),
        ("/health_generate", h.health_generate),
        ("/model_info", h.model_info),
        ("/get_model_info", h.model_info),
        ("/server_info", h.server_info),
        ("/get_server_info", h.server_info),
        ("/get_weight_version", h.get_weight_version),
        ("/weight_version", h.get_weight_version),
        ("/v1/models", h.models),
    ):
        add("GET", path, handler)
    for method in ("GET", "POST"):
        add(method, "/flush_cache", h.flush_cache)
        add(method, "/release_memory_occupation", h.release_memory)
        add(method, "/resume_memory_occupation", h.resume_memory)
    for method in ("POST", "PUT"):
        add(method, "/generate", h.generate)
    for path, handler in (
        ("/pause_generation", h.pause),
        ("/continue_generation", h.resume),
        ("/abort_request", h.abort_request),
        ("/update_weight_version", h.update_weight_version),
        ("/update_weights_from_disk", h.update_from_disk),
        ("/update_weights_from_tensor", h.update_from_tensor),
        ("/load_lora_adapter", h.load_lora),
        ("/unload_lora_adapter", h.unload_lora),
        ("/init_weights_update_group", h.init_group),
        ("/update_weights_from_distributed", h.update_from_distributed),
        ("/destroy_weights_update_group", h.destroy_group),
    ):
        add("POST", path, handler)
    add_openai_routes(app, h)  # /v1/chat/completions, /v1/completions
    return app


@web.middleware
async def _error_middleware(request, handler):
    try:
        return await handler(request)
    except BadRequest as exc:
        return error(exc.status, str(exc))
    except web.HTTPNotFound:
        return error(404, f"No route {request.path}. See SGLang's native API for the routes this server answers.")
    except web.HTTPMethodNotAllowed as exc:
        return error(405, f"{request.method} is not allowed on {request.path}; use {sorted(exc.allowed_methods)}.")
    except web.HTTPException as exc:
        if exc.status >= 400:  # SGLang's JSON error shape, not aiohttp's plain text
            return error(exc.status, f"{request.method} {request.path}: {exc.text or exc.reason}")
        raise
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the server stays up; the client sees what failed
        logger.exception("%s failed", request.path)
        return error(500, f"Internal server error on {request.path}: {exc}")


def _auth_middleware(api_key: str | None):
    """As SGLang: with --api-key, every path except /health* needs the bearer token."""

    @web.middleware
    async def auth(request, handler):
        if api_key and not request.path.startswith("/health"):
            if request.headers.get("Authorization", "") != f"Bearer {api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return auth


class Handlers:
    """One method per route; bodies are validated before anything reaches the scheduler."""

    def __init__(self, state: ServerState):
        self.s = state

    # ---- generation -------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        inp = parse_generate(
            body, vocab_size=self.s.runner.vocab_size, context_length=self.s.context_length, tokenize=self._tokenize()
        )
        if inp.sampling.stop and self.s.tokenizer is None:
            raise BadRequest(
                "sampling_params: 'stop' strings need a tokenizer, but the server "
                "runs with --skip-tokenizer-init; use 'stop_token_ids'."
            )
        rid = inp.rid or uuid.uuid4().hex
        if rid in self.s.inflight:
            raise BadRequest(f"/generate: rid {rid!r} is already in flight; rids must be unique.")
        if inp.lora_path is not None:
            self._check_lora(inp.lora_path)  # fail fast, before waiting out a pause
        self._check_kv_budget(len(inp.input_ids) + inp.sampling.max_new_tokens)
        self._check_memory_resident()  # fail fast; the scheduler checks again at submit
        if self.s.accepted >= self.s.capacity:
            return error(503, self._full_message())
        self.s.accepted += 1
        try:
            await self.s.gate.wait()  # SGLang holds new requests while generation is paused
            if inp.lora_path is not None:  # checked again with no await before the submit
                await self.s.lora_idle.wait()
                self._check_lora(inp.lora_path)
            seq = await self._run(rid, inp.input_ids, inp.sampling, inp.return_logprob)
        finally:
            self.s.accepted -= 1
        reason = seq.finish_reason
        if reason["type"] == "abort" and reason.get("status_code") in (400, 500):
            return error(reason["status_code"], reason["message"])  # refused by the scheduler
        return web.json_response(self._output(seq, inp.return_text_in_logprobs))

    def _check_kv_budget(self, tokens: int) -> None:
        """A request whose own worst-case KV cache exceeds the whole budget can never run."""
        budget = self.s.scheduler.max_total_tokens
        if budget is not None and tokens > budget:
            raise BadRequest(
                f"/generate: the request needs {tokens} KV cache tokens (prompt + "
                f"max_new_tokens), more than the server's whole KV budget, "
                f"max_total_num_tokens {budget} (set by {self._budget_source()}); lower "
                "max_new_tokens or shorten the prompt, or restart the server with a higher "
                "--mem-fraction-static (or --max-total-tokens)."
            )

    def _budget_source(self) -> str:
        budget = self.s.kv_budget
        return budget.limited_by if budget is not None else "--max-total-tokens"

    def _check_memory_resident(self) -> None:
        released = self.s.scheduler.memory_released
        if released:
            raise BadRequest(released_message("/generate", released))

    def _check_lora(self, lora_path: str) -> None:
        try:
            self.s.updater.lora.check_request(lora_path)
        except ValueError as exc:
            raise BadRequest(f"/generate: {exc}") from None

    def _full_message(self) -> str:
        a = self.s.args
        return (
            f"/generate: the server is full: {self.s.accepted} requests are already in it "
            f"(--max-running-requests {a.max_running_requests} running + "
            f"--max-queued-requests {a.max_queued_requests} waiting). Retry later, spread "
            "the load over more servers, or raise --max-queued-requests "
            "(sglang.max_queued_requests)."
        )

    def _tokenize(self):
        tok = self.s.tokenizer
        if tok is None:
            return None
        return lambda text: tok(text, add_special_tokens=False).input_ids

    async def _run(self, rid: str, input_ids, sampling, return_logprob: bool) -> Sequence:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_finish(seq):  # worker thread
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(seq))

        stop_ids = [] if sampling.ignore_eos else sorted(self.s.eos_ids | sampling.stop_token_ids)
        seq = Sequence(
            rid=rid,
            input_ids=input_ids,
            params=sampling,
            stop_ids=stop_ids,
            return_logprob=return_logprob,
            on_finish=on_finish,
            version_spans=[(0, self.s.weight_version)],
        )
        self.s.inflight[rid] = seq
        try:
            self.s.scheduler.submit(seq)
            return await asyncio.shield(done)
        except asyncio.CancelledError:  # client went away: stop spending compute on it
            self.s.scheduler.abort(rid, "Client disconnected.")
            raise
        finally:
            self.s.inflight.pop(rid, None)

    def _output(self, seq: Sequence, text_in_logprobs: bool) -> dict:
        """SGLang's /generate response: text (stop trimmed), output_ids (untrimmed), meta_info."""
        reason = seq.finish_reason
        meta = {
            "id": seq.rid,
            "finish_reason": reason,
            "prompt_tokens": len(seq.input_ids),
            "completion_tokens": len(seq.output_ids),
            "cached_tokens": 0,
            "weight_version": self.s.weight_version,
            "output_version_spans": version_spans(seq),
            "total_retractions": seq.retractions,
            "e2e_latency": time.time() - seq.created,
        }
        if seq.return_logprob:
            meta["input_token_logprobs"] = [[None, seq.input_ids[-1], None]]
            meta["output_token_logprobs"] = [
                [lp, tid, self._token_text(tid) if text_in_logprobs else None]
                for lp, tid in zip(seq.output_logprobs, seq.output_ids)
            ]
        out = {"output_ids": list(seq.output_ids), "meta_info": meta}
        if self.s.tokenizer is not None:
            out = {"text": self._text(seq), **out}
        return out

    def _text(self, seq: Sequence) -> str:
        ids, reason = seq.output_ids, seq.finish_reason
        matched = reason.get("matched")
        trim = not seq.params.no_stop_trim
        if trim and isinstance(matched, int) and not isinstance(matched, bool) and ids:
            ids = ids[:-1]
        text = self.s.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)
        if trim and isinstance(matched, str) and matched in text:
            text = text[: text.find(matched)]
        return text

    def _token_text(self, tid: int) -> str | None:
        return None if self.s.tokenizer is None else self.s.tokenizer.decode([tid])

    # ---- health and info --------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """Generate one token; while generation is paused or memory is released the server
        counts as healthy (the caller chose that nothing runs)."""
        if not self.s.gate.is_set() or self.s.scheduler.memory_released:
            return web.Response(status=200)
        rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
        try:
            await asyncio.wait_for(
                self._run(rid, [0], SamplingParams(max_new_tokens=1, top_k=1), False), HEALTH_GENERATE_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        a = self.s.args
        return web.json_response(
            {
                "model_path": a.model_path,
                "tokenizer_path": a.tokenizer_path or a.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.s.weight_version,
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """Server args, batching statistics and load (SGLang puts scheduler state in
        `internal_states`; ours holds the batching stats), the KV budget (SGLang's
        max_total_num_tokens) and this process's memory (for per-phase peaks in benchmarks)."""
        stats = self.s.scheduler.stats.as_dict()
        info = {k: v for k, v in asdict(self.s.args).items() if k != "api_key"}
        budget = self.s.kv_budget
        info.update(
            {
                "context_length": self.s.context_length,
                "max_total_num_tokens": self.s.scheduler.max_total_tokens,
                "kv_budget": budget.as_dict() if budget is not None else None,
                "memory": self._memory(),
                "weight_version": self.s.weight_version,
                "resolved_device": str(self.s.runner.device),
                "resolved_dtype": str(self.s.runner.dtype).removeprefix("torch."),
                "batching": stats,
                "load": {
                    **self.s.scheduler.load(),
                    "accepted": self.s.accepted,
                    "capacity": self.s.capacity,
                    "accept_out_of_files": self.s.accept_out_of_files,
                },
                "internal_states": [{"batching": stats}],
                "uptime_s": time.time() - self.s.started,
                "version": "areal-builtin",
            }
        )
        return web.json_response(info)

    def _memory(self) -> dict:
        memory = memory_readings(self.s.runner.device)
        offloader = self.s.updater.offloader
        memory.update(
            released=sorted(self.s.scheduler.memory_released),
            kv_cache_bytes=self.s.scheduler.kv_cache_bytes(),
            offloaded_weights_bytes=offloader.offloaded_bytes() if offloader else 0,
        )
        return memory

    async def models(self, request: web.Request) -> web.Response:
        path = self.s.args.model_path
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": path,
                        "object": "model",
                        "created": int(self.s.started),
                        "owned_by": "areal",
                        "root": path,
                        "max_model_len": self.s.context_length,
                    }
                ],
            }
        )

    async def get_weight_version(self, request: web.Request) -> web.Response:
        """Gone from SGLang 0.5.9 on; its answer: a 404 that names /model_info."""
        return error(
            404, "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        """There is no prefix cache to flush (each request prefills its own prompt), but the
        answer is SGLang's: 400 while requests wait or run, after waiting up to `?timeout=`
        seconds for them to drain."""
        try:
            timeout = float(request.query.get("timeout", "0") or 0)
        except ValueError:
            raise BadRequest(f"/flush_cache: timeout {request.query.get('timeout')!r} is not a number of seconds.")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                await asyncio.wrap_future(
                    self.s.scheduler.call(lambda: self.s.scheduler.check_flushable("/flush_cache"))
                )
                return web.Response(text="Cache flushed.\n", status=200)
            except ServerBusy as exc:
                if time.monotonic() >= deadline:
                    return web.Response(text=str(exc) + "\n", status=400)
            await asyncio.sleep(0.05)

    # ---- memory occupation (colocation; see memory.py) ---------------------------------------
    async def release_memory(self, request: web.Request) -> web.Response:
        """SGLang's /release_memory_occupation {tags}; SGLang answers 200 with no fields, we
        add success, message, changed, released (tags released now) and seconds."""
        tags = await self._memory_tags(request, "/release_memory_occupation")
        return await self._memory_op(lambda: self.s.memory.release(tags))

    async def resume_memory(self, request: web.Request) -> web.Response:
        tags = await self._memory_tags(request, "/resume_memory_occupation")
        return await self._memory_op(lambda: self.s.memory.resume(tags))

    async def _memory_tags(self, request: web.Request, where: str) -> list[str]:
        """`tags`: null, absent or [] mean all (SGLang's rule); unknown tags are a 400."""
        body = await read_json(request, allow_empty=True)
        check_keys(body, {"tags", "rid"}, where)
        tags = body.get("tags")
        if tags is None or tags == []:
            return list(MEMORY_TAGS)
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise BadRequest(
                f"{where}: 'tags' must be null or a list of strings from {list(MEMORY_TAGS)}, got {tags!r}."
            )
        unknown = [t for t in tags if t not in MEMORY_TAGS]
        if unknown:
            raise BadRequest(
                f"{where}: unknown tag(s) {unknown}; valid tags are "
                f"{list(MEMORY_TAGS)} (null for all). The built-in server has no "
                "CUDA graphs, so SGLang's 'cuda_graph' is not one."
            )
        return list(dict.fromkeys(tags))

    async def _memory_op(self, fn) -> web.Response:
        """Run on the worker between steps: 400 while requests need the memory, 503 when the
        device has no room for the weights yet."""
        try:
            reply = await asyncio.wrap_future(self.s.scheduler.call(fn))
        except ServerBusy as exc:
            return error(400, str(exc))
        except DeviceMemoryShort as exc:
            return error(503, str(exc))
        return web.json_response(reply)

    # ---- pause / continue / abort -----------------------------------------------------------
    async def pause(self, request: web.Request) -> web.Response:
        body = await read_json(request, allow_empty=True)
        check_keys(body, {"mode", "rid"}, "/pause_generation")
        mode = get_typed(body, "mode", str, "abort", "/pause_generation")
        if mode not in PAUSE_MODES:
            raise BadRequest(f"/pause_generation: mode {mode!r} is invalid; use one of {list(PAUSE_MODES)}.")
        self.s.gate.clear()
        t0 = time.perf_counter()
        if mode == "abort":
            held = await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by /pause_generation."))
        else:
            held = await asyncio.wrap_future(self.s.scheduler.pause(mode))
        # beyond SGLang's answer: what the pause cost here (a weight update waits for it)
        count_key = "requests_aborted" if mode == "abort" else "requests_held"
        return web.json_response(
            {
                "message": "Generation paused successfully.",
                "status": "ok",
                count_key: held,
                "pause_s": time.perf_counter() - t0,
            }
        )

    async def resume(self, request: web.Request) -> web.Response:
        body = await read_json(request, allow_empty=True)
        check_keys(body, {"rid"}, "/continue_generation")
        await asyncio.wrap_future(self.s.scheduler.resume())
        self.s.gate.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        check_keys(body, {"rid", "abort_all", "finished_reason", "abort_message"}, "/abort_request")
        rid = get_typed(body, "rid", str, "", "/abort_request")
        abort_all = get_typed(body, "abort_all", bool, False, "/abort_request")
        message = get_typed(body, "abort_message", str, None, "/abort_request")
        if abort_all or rid:
            await asyncio.wrap_future(
                self.s.scheduler.abort(None if abort_all else rid, message or "Aborted by /abort_request.")
            )
        return web.Response(status=200)

    # ---- weights ----------------------------------------------------------------------------
    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/update_weight_version"
        check_keys(body, {"new_version", "abort_all_requests", "rid"}, where)
        version = get_typed(body, "new_version", str, None, where)
        if version is None:
            raise BadRequest(f"{where}: 'new_version' (string) is required.")
        if get_typed(body, "abort_all_requests", bool, True, where):  # SGLang's default
            await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by " + where))
        self._set_weight_version(version)
        return web.json_response(
            {"success": True, "new_version": version, "message": f"Weight version updated to {version}"}
        )

    async def update_from_disk(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/update_weights_from_disk"
        check_keys(
            body,
            {
                "model_path",
                "load_format",
                "abort_all_requests",
                "weight_version",
                "is_async",
                "torch_empty_cache",
                "keep_pause",
                "flush_cache",
                "rid",
            },
            where,
        )
        path = get_typed(body, "model_path", str, None, where)
        if not path:
            raise BadRequest(f"{where}: 'model_path' (string) is required.")
        try:
            check_weight_path(path, self.s.weight_roots, where)
        except BadRequest as exc:
            return self._weights_reply(False, str(exc), None, status=exc.status)
        get_typed(body, "load_format", str, None, where)  # checked, then ignored
        version = get_typed(body, "weight_version", str, None, where)
        if get_typed(body, "abort_all_requests", bool, False, where):
            await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by " + where))
        timings: dict[str, float] = {}  # load_s: read + copy, reported for benchmarks
        flush = get_typed(body, "flush_cache", bool, True, where)  # SGLang's default
        ok, message = await self._on_worker(
            self._flush_checked(flush, where, lambda: self.s.updater.load_from_disk(path, timings))
        )
        return self._weights_reply(ok, message, version, extra={"num_paused_requests": 0, **timings})

    async def update_from_tensor(self, request: web.Request) -> web.Response:
        """SGLang's /update_weights_from_tensor (weights.py has the protocol). Reply: success,
        message, and deserialize_s / load_s on success."""
        body = await read_json(request)
        where = "/update_weights_from_tensor"
        check_keys(
            body,
            {
                "serialized_named_tensors",
                "load_format",
                "flush_cache",
                "abort_all_requests",
                "weight_version",
                "selector",
                "torch_empty_cache",
                "rid",
            },
            where,
        )
        payload = _rank0_payload(body.get("serialized_named_tensors"), where)
        _check_tensor_update_options(body, where)
        empty_cache = get_typed(body, "torch_empty_cache", bool, False, where)
        version = get_typed(body, "weight_version", str, None, where)
        if get_typed(body, "abort_all_requests", bool, False, where):
            await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by " + where))
        timings: dict[str, float] = {}  # deserialize_s, load_s: reported for benchmarks

        def update() -> str:
            message = self.s.updater.update_from_tensors(payload, timings)
            if empty_cache:
                _empty_cuda_cache(self.s.runner.device)
            return message

        flush = get_typed(body, "flush_cache", bool, True, where)  # SGLang's default
        ok, message = await self._on_worker(self._flush_checked(flush, where, update))
        return self._weights_reply(ok, message, version, extra=timings)

    async def load_lora(self, request: web.Request) -> web.Response:
        """SGLang's /load_lora_adapter; the adapter becomes the one served (see lora.py)."""
        body = await read_json(request)
        where = "/load_lora_adapter"
        check_keys(body, {"lora_name", "lora_path", "pinned", "lora_id", "rid"}, where)
        name = get_typed(body, "lora_name", str, None, where)
        path = get_typed(body, "lora_path", str, None, where)
        if not name or not path:
            raise BadRequest(f"{where}: 'lora_name' and 'lora_path' (strings) are required.")
        get_typed(body, "pinned", bool, False, where)  # one adapter at a time: nothing to pin
        try:
            check_weight_path(path, self.s.weight_roots, where, key="lora_path")
        except BadRequest as exc:
            return self._lora_reply(False, str(exc), status=exc.status)
        ok, message = await self._lora_op(where, lambda: self.s.updater.lora.load(name, path))
        return self._lora_reply(ok, message)

    async def unload_lora(self, request: web.Request) -> web.Response:
        """SGLang's /unload_lora_adapter; unloading the served adapter restores the base."""
        body = await read_json(request)
        where = "/unload_lora_adapter"
        check_keys(body, {"lora_name", "lora_id", "rid"}, where)
        name = get_typed(body, "lora_name", str, None, where)
        if not name:
            raise BadRequest(f"{where}: 'lora_name' (string) is required.")
        ok, message = await self._lora_op(where, lambda: self.s.updater.lora.unload(name))
        return self._lora_reply(ok, message)

    async def _lora_op(self, where: str, fn) -> tuple[bool, str]:
        def guarded():  # merging needs the weights on the device (checked on the worker)
            if self.s.updater.weights_released:
                raise MemoryReleased(released_message(where, {"weights"}))
            return fn()

        self.s.lora_ops += 1
        self.s.lora_idle.clear()
        try:
            return await self._on_worker(guarded)
        finally:
            self.s.lora_ops -= 1
            if self.s.lora_ops == 0:
                self.s.lora_idle.set()

    def _lora_reply(self, ok: bool, message: str, status: int = 400) -> web.Response:
        """SGLang's LoRA reply: success, error_message, loaded_adapters (name -> path); we add
        message and the adapter being served."""
        lora = self.s.updater.lora
        return web.json_response(
            {
                "success": ok,
                "error_message": "" if ok else message,
                "message": message,
                "loaded_adapters": dict(lora.loaded),
                "active_adapter": lora.active,
            },
            status=200 if ok else status,
        )

    async def init_group(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/init_weights_update_group"
        check_keys(
            body, {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend", "rid"}, where
        )
        kw = {
            "master_address": get_typed(body, "master_address", str, None, where),
            "master_port": get_typed(body, "master_port", int, None, where),
            "rank_offset": get_typed(body, "rank_offset", int, None, where),
            "world_size": get_typed(body, "world_size", int, None, where),
            "group_name": get_typed(body, "group_name", str, "weight_update_group", where),
            "backend": get_typed(body, "backend", str, "nccl", where),
        }
        missing = [k for k, v in kw.items() if v is None]
        if missing:
            raise BadRequest(f"{where}: missing required key(s) {missing}.")
        if kw["backend"] not in ("nccl", "gloo"):
            raise BadRequest(f"{where}: backend {kw['backend']!r} is invalid; use 'nccl' (GPU) or 'gloo' (CPU).")
        if not 1 <= kw["rank_offset"] < kw["world_size"]:
            raise BadRequest(
                f"{where}: rank_offset must be in [1, world_size); rank 0 is the "
                f"trainer. Got rank_offset={kw['rank_offset']}, "
                f"world_size={kw['world_size']}."
            )
        ok, message = await self._on_worker(lambda: self.s.updater.init_group(**kw))
        return self._weights_reply(ok, message, None)

    async def update_from_distributed(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        where = "/update_weights_from_distributed"
        check_keys(
            body,
            {
                "names",
                "dtypes",
                "shapes",
                "group_name",
                "flush_cache",
                "abort_all_requests",
                "weight_version",
                "load_format",
                "rid",
            },
            where,
        )
        names = _str_list(body.get("names"), "names", where)
        dtypes = _str_list(body.get("dtypes"), "dtypes", where)
        shapes = body.get("shapes")
        if not isinstance(shapes, list) or not all(
            isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes
        ):
            raise BadRequest(f"{where}: 'shapes' must be a list of lists of non-negative ints.")
        if not len(names) == len(dtypes) == len(shapes):
            raise BadRequest(
                f"{where}: names, dtypes and shapes must have equal lengths; got "
                f"{len(names)}, {len(dtypes)}, {len(shapes)}."
            )
        bad = sorted({d for d in dtypes if d not in ("bfloat16", "float16", "float32")})
        if bad:
            raise BadRequest(f"{where}: dtypes {bad} are invalid; use bfloat16, float16 or float32.")
        group = get_typed(body, "group_name", str, "weight_update_group", where)
        flush = get_typed(body, "flush_cache", bool, True, where)  # SGLang's default
        version = get_typed(body, "weight_version", str, None, where)
        if get_typed(body, "abort_all_requests", bool, False, where):
            await asyncio.wrap_future(self.s.scheduler.abort(None, "Aborted by " + where))
        timings: dict[str, float] = {}  # recv_s, load_s: reported for benchmarks
        ok, message = await self._on_worker(
            self._flush_checked(
                flush,
                where,
                lambda: self.s.updater.update_from_distributed(
                    names=names, dtypes=dtypes, shapes=shapes, group_name=group, timings=timings
                ),
            )
        )
        return self._weights_reply(ok, message, version, extra=timings)

    async def destroy_group(self, request: web.Request) -> web.Response:
        body = await read_json(request, allow_empty=True)
        where = "/destroy_weights_update_group"
        check_keys(body, {"group_name", "rid"}, where)
        group = get_typed(body, "group_name", str, "weight_update_group", where)
        ok, message = await self._on_worker(lambda: self.s.updater.destroy_group(group))
        return self._weights_reply(ok, message, None)

    def _flush_checked(self, flush: bool, where: str, load):
        """`load` run on the worker, refused first (as SGLang's flush after the update would be)
        when the update asks for a flush while requests are held (see check_flushable)."""

        def run():
            if flush:
                self.s.scheduler.check_flushable(where)
            return load()

        return run

    async def _on_worker(self, fn) -> tuple[bool, str]:
        """Run a weight operation between decode steps (after running requests finish,
        unless paused, as SGLang does); errors become (False, message)."""
        try:
            return True, await asyncio.wrap_future(self.s.scheduler.call(fn, drain=True))
        except Exception as exc:
            logger.warning("weight operation failed: %s", exc)
            return False, str(exc)

    def _weights_reply(
        self, ok: bool, message: str, version: str | None, extra: dict | None = None, status: int = 400
    ) -> web.Response:
        if ok and version is not None:
            self._set_weight_version(version)
            message += f" Weight version updated to {version}."
        return web.json_response({"success": ok, "message": message, **(extra or {})}, status=200 if ok else status)

    def _set_weight_version(self, version: str) -> None:
        """Take `version` and mark where it starts in every sequence in flight. Paused (in_place
        or retract, as a weight update pauses) no step runs meanwhile, so the index is exact;
        a version set mid-generation lands on a step boundary seen from this thread."""
        self.s.weight_version = version
        for seq in list(self.s.inflight.values()):
            seq.version_spans.append((len(seq.output_ids), version))


def _rank0_payload(payloads, where: str) -> str:
    """The one entry of `serialized_named_tensors`. SGLang's tensor-parallel rank r reads entry
    r and no other (reading another rank's entry would take that rank's CUDA IPC references);
    this server runs one rank, so a list of any other length is a 400."""
    if not isinstance(payloads, list) or not all(isinstance(p, str) for p in payloads):
        raise BadRequest(
            f"{where}: 'serialized_named_tensors' (a list of base64 strings, one per tensor-parallel rank) is required."
        )
    if len(payloads) != 1:
        raise BadRequest(
            f"{where}: 'serialized_named_tensors' has {len(payloads)} entries; this "
            "server runs one tensor-parallel rank (tp 1), so send exactly one: the "
            "serialized (name, tensor) list for rank 0."
        )
    return payloads[0]


def _check_tensor_update_options(body: dict, where: str) -> None:
    load_format = get_typed(body, "load_format", str, None, where)
    if load_format not in TENSOR_LOAD_FORMATS:
        raise BadRequest(
            f"{where}: load_format {load_format!r} is not supported by the built-in "
            "server; use null or 'direct' (both copy by Hugging Face state-dict "
            "name). 'flattened_bucket' needs SGLang's own classes in the payload, "
            "which this server does not unpickle: send (name, tensor) pairs."
        )
    selector = get_typed(body, "selector", str, "all", where)
    if selector not in TENSOR_SELECTORS:
        raise BadRequest(
            f"{where}: selector {selector!r} is invalid here; the built-in server "
            f"has no draft model, use one of {list(TENSOR_SELECTORS)}."
        )
    get_typed(body, "flush_cache", bool, True, where)  # nothing is cached across requests


def _empty_cuda_cache(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


def version_spans(seq: Sequence) -> list[list]:
    """`[[start, version], ...]`: output tokens from `start` on (to the next start) came from
    weights of `version`. Beyond SGLang's answer, which has only the version at the end: with
    pause_mode in_place or retract a request lives through weight updates, and the client
    labels each token with the version that produced it."""
    spans: list[list] = []
    for start, version in seq.version_spans:
        if start >= len(seq.output_ids) and spans:
            break  # a change after the last token produced nothing
        if spans and spans[-1][0] == start:
            spans[-1][1] = version  # two changes before the next token: the later one counts
        elif not spans or spans[-1][1] != version:
            spans.append([start, version])
    return spans


def _str_list(value, key: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{where}: '{key}' must be a list of strings.")
    return value
