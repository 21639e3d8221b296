"""RemoteSGLangEngine: the trainer's client of SGLang-compatible inference servers.

    engine = RemoteSGLangEngine(cfg)            # cfg: a validated ExperimentConfig
    engine.initialize()                         # find servers, wait for /health
    resp = await engine.agenerate(ModelRequest(input_ids=[...], max_new_tokens=64))
    engine.control.update_weights(WeightUpdateMeta("disk", path="/ckpt/step1", version=1))

    engine = RemoteSGLangEngine.from_pretrained("/models/tiny", dp_size=2)  # starts 2 servers

Servers come from rollout.server_addrs, $AREAL_SERVER_ADDRS or the launcher's name record
(see discovery.py). Requests go to the server with the fewest in flight from this client
(round-robin among equals). Connection errors are retried with backoff (rollout.request_retries;
when the launcher restarts the run's failed servers, long enough to wait out a restart).
When servers pause for a weight update with pause_mode=abort (what `auto` picks for SGLang),
a request comes back aborted with the tokens generated so far; the client resubmits prompt + those
tokens with the remaining budget once generation continues, so no sample is lost, and every token
keeps the weight version that produced it. With retract (what `auto` picks for the built-in server)
or in_place the server holds the request over the update and finishes it after continue. The
built-in server says which tokens each version produced (output_version_spans); SGLang reports only
the version at the end, unless rollout.stream_interval streams the answer (auto does under retract
and in_place): each chunk's tokens then carry the version the server named as it sent the chunk.
Every request names its weight version as its prefix-cache namespace (areal.infra.pause), so no
request reuses keys and values computed under older weights.

`engine.control` (control.py, ServerControl) is the one object that pauses the servers, takes new
weights, flushes and continues; this module sends only /generate itself.

The engine also fronts a RolloutExecutor (submit / wait / prepare_batch / rollout_batch), as
AReaL-lite's engine does, so a training loop needs one object for rollouts.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Any

from areal.api.inference import InferenceEngine, ModelRequest, ModelResponse
from areal.api.source import LoaderPosition
from areal.engine.sglang import protocol
from areal.engine.sglang.control import OpenRequests, ServerControl, read_server_infos
from areal.engine.sglang.http import ServerError, apost_json, auth_headers, fanout, get_json, retries_for
from areal.infra.discovery import discover_server_addrs
from areal.infra.health import wait_healthy
from areal.infra.pause import cache_namespace, resolve_pause_mode, resolve_stream_interval

logger = logging.getLogger(__name__)

_ABORT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


# /get_server_info "batching" counters that add up over time (and over servers)
BATCHING_COUNTERS = (
    "prefill_steps",
    "prefill_tokens",
    "prefill_s",
    "decode_steps",
    "decode_rows",
    "decode_s",
    "generated_tokens",
)


BUILTIN_SERVER = "areal-builtin"  # the built-in server's /server_info "version"


def program_kind(programs: list[str | None]) -> str | None:
    """builtin or sglang from the servers' /server_info "version"s; None when mixed or unknown."""
    kinds = {None if p is None else ("builtin" if p == BUILTIN_SERVER else "sglang") for p in programs}
    return kinds.pop() if len(kinds) == 1 else None


def check_servers_fit_mode(mode: str, infos: list[dict | None], addrs: list[str]) -> None:
    """SGLang servers run by someone else in retract mode must have their radix cache off
    (areal.infra.pause: retracted requests would reuse prompt KV of the old weights); SGLang
    outside the tested versions is a warning."""
    from areal.infra.servers import sglang_version_note

    for addr, info in zip(addrs, infos):
        if not info or info.get("version") in (None, BUILTIN_SERVER):
            continue
        note = sglang_version_note(str(info["version"]))
        if note:
            logger.warning("inference server %s: %s", addr, note)
        if mode == "retract" and info.get("disable_radix_cache") is False:
            raise RuntimeError(
                f"inference server {addr} is SGLang with its radix cache on, and rollout.pause_mode=retract: "
                "retracted requests would be prefilled again on prompt KV cached under the old weights. "
                "Start it with --disable-radix-cache, or set rollout.pause_mode=abort or in_place"
            )


def server_capacity(info: dict | None) -> int | None:
    """Requests a server holds at most, running and queued (past it, 503): the built-in server's
    /server_info load.capacity, or SGLang's max_running_requests + max_queued_requests when both
    are set; None when unbounded or unknown."""
    if not isinstance(info, dict):
        return None
    load = info.get("load")
    if isinstance(load, dict) and isinstance(load.get("capacity"), int):
        return load["capacity"]
    running, queued = info.get("max_running_requests"), info.get("max_queued_requests")
    if isinstance(running, int) and isinstance(queued, int):
        return running + queued
    return None


def token_versions(result: protocol.GenerateResult, sent_version: int) -> list[int]:
    """The weight version of each token of one /generate answer: the server's per-token spans,
    else the version it reports at the end, else (no integer version) the client's at sending."""
    if result.output_versions is not None:
        return [sent_version if v is None else v for v in result.output_versions]
    version = sent_version if result.weight_version is None else result.weight_version
    return [version] * len(result.output_ids)


class RemoteSGLangEngine(InferenceEngine):
    def __init__(self, config, *, _own_servers=None):
        """`config` is a validated ExperimentConfig (uses rollout, sglang, cluster, launcher)."""
        self.config = config
        self._rcfg = config.rollout
        self._headers = auth_headers(config.sglang.api_key)
        self._retries = request_retries(config)
        self._own_servers = _own_servers
        self.addrs: list[str] = []
        # the server program: the launcher writes the one it started into config.yaml; servers
        # from from_pretrained say theirs; only external servers under rollout.server=auto are asked
        self.server_kind: str | None = None if self._rcfg.server == "auto" else self._rcfg.server
        self._server_programs: list[str | None] = []  # /server_info "version" per server
        self._inflight: dict[str, int] = {}  # samples per server, across their resubmissions
        self._open = OpenRequests()  # /generate requests awaiting their answer (a pause drains them)
        self.request_counts: dict[str, int] = {}
        self._rr = 0
        self._lock = threading.Lock()
        self._control: ServerControl | None = None  # built by initialize(), with the servers and the mode
        self._executor = None
        self._initialized = False
        self.server_capacity: int | None = None  # requests each server holds at most (None: unbounded)
        # tokens per streamed chunk, None for whole answers: rollout.stream_interval with auto
        # resolved by initialize() for the pause mode and server program (areal.infra.pause)
        self.stream_interval: int | None = None

    @property
    def open_requests(self) -> OpenRequests:
        """This client's /generate requests awaiting their answer, which an abort-mode pause drains."""
        return self._open

    @property
    def control(self) -> ServerControl:
        """The one object that pauses these servers, updates their weights and continues them."""
        if self._control is None:
            raise RuntimeError("RemoteSGLangEngine.control exists once initialize() has found the servers")
        return self._control

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        tokenizer_path: str | None = None,
        dp_size: int | None = None,
        tp_size: int | None = None,
        server_addrs: list[str] | None = None,
        max_concurrent_rollouts: int | None = None,
        **config_overrides,
    ) -> "RemoteSGLangEngine":
        """An initialized engine for `model`, configured exactly as the YAML path would be.

        dp_size servers (default 1, or len(server_addrs)) with tp_size devices each (default 1).
        With server_addrs the engine connects to them (their count must equal dp_size); without,
        it starts dp_size servers itself (SGLang when installed and CUDA is present, else the
        built-in server; see rollout.server) and stops them on destroy(). Any config field can be
        passed: dotted (**{"gconfig.max_new_tokens": 64}) or nested (gconfig={"max_new_tokens": 64}).
        """
        from areal.engine.sglang.local_servers import LocalServers
        from areal.engine.sglang.pretrained import pretrained_config

        cfg = pretrained_config(
            model,
            tokenizer_path=tokenizer_path,
            dp_size=dp_size,
            tp_size=tp_size,
            server_addrs=server_addrs,
            max_concurrent_rollouts=max_concurrent_rollouts,
            **config_overrides,
        )
        engine = cls(cfg, _own_servers=None if cfg.rollout.server_addrs else LocalServers(cfg))
        try:
            engine.initialize()
        except BaseException:
            engine.destroy()
            raise
        return engine

    # ---- setup ------------------------------------------------------------------------------

    def initialize(self, *, served_version: int = 0) -> None:
        """Start owned servers (from_pretrained), find the servers, wait until all are healthy,
        and build their control with the pause mode resolved for their program.

        served_version: the weight version the servers hold (a process joining a running run's
        servers); tokens whose server reports no version are attributed to it."""
        if self._initialized:
            return
        from areal.infra.sockets import raise_open_file_limit

        raise_open_file_limit()  # every request in flight holds a socket
        addrs = self._find_servers(self._rcfg.setup_timeout_s)
        info_routes: dict[str, str] = {}
        infos = read_server_infos(addrs, self._get, info_routes)
        self._server_programs = [info.get("version") if info else None for info in infos]
        capacities = [server_capacity(info) for info in infos]
        self.server_capacity = None if None in capacities else min(capacities)
        if self._rcfg.server == "auto":  # not named by the launcher's config: known now
            self.server_kind = self.server_kind or program_kind(self._server_programs)
        mode = self._resolved_pause_mode()
        check_servers_fit_mode(mode, infos, addrs)
        self.stream_interval = resolve_stream_interval(self._rcfg.stream_interval, mode, self.server_kind)
        self._control = ServerControl(
            addrs,
            pause_mode=mode,
            api_key=self.config.sglang.api_key,
            retries=self._retries,
            weight_timeout_s=self._rcfg.weight_update_timeout_s,
            control_timeout_s=self._rcfg.control_timeout_s,
            ranks_per_server=self._tp_size(),
            info_routes=info_routes,
        )
        self._control.set_version(served_version)
        self._control.watch_requests(self._open)
        self.addrs = addrs
        self._inflight = {a: 0 for a in addrs}
        self.request_counts = {a: 0 for a in addrs}
        self._initialized = True
        logger.info("inference servers ready: %s", ", ".join(addrs))
        logger.info("weight updates pause generation with mode %s (rollout.pause_mode=%s)", mode, self._rcfg.pause_mode)
        if self.stream_interval is not None:
            logger.info(
                "answers are streamed every %d tokens (rollout.stream_interval=%s)",
                self.stream_interval,
                self._rcfg.stream_interval,
            )
        self._check_server_count()
        self._check_server_versions()

    def _find_servers(self, timeout: float) -> list[str]:
        """The owned servers once started (from_pretrained), else the discovered ones; healthy."""
        if self._own_servers is None:
            addrs = self._discover(timeout)
            self._wait_healthy(addrs, timeout)
            return addrs
        addrs = self._own_servers.start()
        self._own_servers.wait_healthy(timeout, self._headers)
        self.server_kind = self._own_servers.kind
        return addrs

    def _resolved_pause_mode(self) -> str:
        """The launcher wrote the mode it resolved into config.yaml, and servers this engine
        started resolved theirs; only servers found here under rollout.pause_mode=auto are
        resolved now, for their program."""
        if self._own_servers is not None:
            return self._own_servers.pause_mode
        return resolve_pause_mode(self._rcfg.pause_mode, self.server_kind)

    def _get(self, addr: str, route: str):
        return get_json(
            addr,
            route,
            timeout=self._rcfg.control_timeout_s,
            headers=self._headers,
            timeout_key="rollout.control_timeout_s",
        )

    @property
    def pause_mode(self) -> str:
        """How servers pause for a weight update (rollout.pause_mode, auto resolved)."""
        return self.control.pause_mode

    def warm_up(self, bursts: list[tuple[str, list[ModelRequest]]]) -> float:
        """Send each named burst of requests at once, one burst after another, so that the servers
        compile their kernels for those batch shapes and sampling settings now rather than inside
        the first step or evaluation (SGLang JIT-compiles per batch shape, and its sampler has a
        kernel of its own for batches that mix greedy and sampled requests). Returns the seconds."""
        self._require_initialized()
        t0 = time.monotonic()

        async def burst(reqs: list[ModelRequest]) -> None:
            await asyncio.gather(*(self.agenerate(r.copy()) for r in reqs))

        for name, reqs in bursts:
            if not reqs:
                continue
            t = time.monotonic()
            asyncio.run(burst(reqs))
            logger.info("warm-up, %s: %d concurrent requests in %.1f s", name, len(reqs), time.monotonic() - t)
        return time.monotonic() - t0

    def _check_server_count(self) -> None:
        from areal.config.parallel import ParallelStrategyError, parse_parallel

        try:
            dp = parse_parallel(self._rcfg.backend, allowed_backends=("sglang",)).dp
        except ParallelStrategyError:
            return
        if dp != len(self.addrs):
            logger.warning(
                "rollout.backend=%s says %d servers but %d were found (%s); using those found",
                self._rcfg.backend,
                dp,
                len(self.addrs),
                ", ".join(self.addrs),
            )

    def _check_server_versions(self) -> None:
        """Warn when servers hold weights of another version than this client assumes (e.g. a
        restarted trainer that did not recover): tokens are labelled with the servers' version."""
        try:
            versions = self.control.server_versions()
        except (RuntimeError, protocol.ProtocolError) as e:  # fanout names the servers that failed
            logger.warning("cannot read the servers' weight versions from %s: %s", protocol.MODEL_INFO, e)
            return
        known = {v for v in versions.values() if v is not None}
        if known and known != {self.get_version()}:
            logger.warning(
                "servers report weight versions %s but the client is at version %d; "
                "pass initialize(served_version=...) or call control.set_version() after recovery, or push weights",
                versions,
                self.get_version(),
            )

    def _discover(self, timeout: float) -> list[str]:
        """Poll until some source names servers (the launcher may still be starting them)."""
        deadline = time.monotonic() + timeout
        while True:
            addrs, source = discover_server_addrs(self.config)
            if addrs:
                return addrs
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no inference servers found within {timeout:.0f}s (rollout.setup_timeout_s): "
                    f"rollout.server_addrs is empty, $AREAL_SERVER_ADDRS is unset and {source} does "
                    "not exist; set rollout.server_addrs=[host:port,...] or start the run with areal-launch"
                )
            time.sleep(0.5)

    def _wait_healthy(self, addrs: list[str], timeout: float) -> None:
        wait_healthy(
            {a: a for a in addrs}, timeout, interval=0.25, headers=self._headers, timeout_key="rollout.setup_timeout_s"
        )

    def destroy(self) -> None:
        """Stop the executor, then any servers this engine started."""
        if self._executor is not None:
            self._executor.destroy()
            self._executor = None
        if self._control is not None:  # None when initialize() failed before finding the servers
            self._control.close()
        if self._own_servers is not None:
            self._own_servers.stop()
        self._initialized = False

    def __enter__(self) -> "RemoteSGLangEngine":
        self.initialize()
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    # ---- generation -------------------------------------------------------------------------

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate one sample, resubmitting the remainder after aborts (see module docstring)."""
        self._require_initialized()
        start = time.monotonic()
        addr = self._acquire_server()
        out_ids: list[int] = []
        out_lps: list[float] = []
        out_versions: list[int] = []
        streamed = self.stream_interval is not None
        try:
            for round_ in itertools.count():
                await self._control.wait_continued()
                remaining = req.max_new_tokens - len(out_ids)
                body = protocol.generate_payload(
                    req,
                    rid=req.rid if round_ == 0 else f"{req.rid}-r{round_}",
                    input_ids=req.input_ids + out_ids,
                    max_new_tokens=remaining,
                    min_new_tokens=max(0, req.min_new_tokens - len(out_ids)),
                    lora_path=self._control.lora_name,
                    cache_namespace=cache_namespace(self.get_version()),
                    stream_interval=self.stream_interval,
                )
                sent_version = self.get_version()
                with self._open.posted():
                    answer = await self._apost(addr, protocol.GENERATE, body, stream=streamed)
                try:
                    result = protocol.parse_generate_stream(answer) if streamed else protocol.parse_generate(answer)
                except protocol.ProtocolError as e:  # the answer alone does not say which server sent it
                    raise ServerError(addr, protocol.GENERATE, str(e)) from e
                out_ids += result.output_ids
                out_lps += result.output_logprobs
                out_versions += token_versions(result, sent_version)
                stop = result.stop_reason
                if stop != "abort":
                    break
                if len(out_ids) >= req.max_new_tokens:
                    stop = "length"
                    break
                if not result.output_ids:
                    await self._abort_backoff(addr, result, start, round_)
        finally:
            self._release_server(addr)
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=out_ids,
            output_logprobs=out_lps,
            output_versions=out_versions,
            stop_reason=stop,
            latency=time.monotonic() - start,
            rid=req.rid,
        )

    async def _abort_backoff(self, addr: str, result, start: float, round_: int) -> None:
        """An abort without progress: servers paused by someone else, or a server that keeps
        aborting. Back off; give up after request_timeout_s so nothing waits forever. Under this
        control's own pause (a request still queued on the server when it was aborted) the gate
        waits for continue instead: a backoff would let the episodes admitted at continue pass it."""
        if time.monotonic() - start > self._rcfg.request_timeout_s:
            raise ServerError(
                addr,
                protocol.GENERATE,
                f"request kept being aborted for {self._rcfg.request_timeout_s:.0f}s "
                f"(rollout.request_timeout_s); last message: {result.message!r}",
            )
        if not self._control.paused:
            await asyncio.sleep(_ABORT_BACKOFF_S[min(round_, len(_ABORT_BACKOFF_S) - 1)])

    async def _apost(self, addr: str, route: str, body: dict, stream: bool = False) -> Any:
        return await apost_json(
            addr,
            route,
            body,
            timeout=self._rcfg.request_timeout_s,
            retries=self._retries,
            headers=self._headers,
            stream=stream,
        )

    def _acquire_server(self) -> str:
        """The server with the fewest requests in flight from this client; ties round-robin."""
        with self._lock:
            n = len(self.addrs)
            order = [self.addrs[(self._rr + i) % n] for i in range(n)]
            addr = min(order, key=lambda a: self._inflight[a])
            self._rr = (self.addrs.index(addr) + 1) % n
            self._inflight[addr] += 1
            self.request_counts[addr] += 1
            return addr

    def _release_server(self, addr: str) -> None:
        with self._lock:
            self._inflight[addr] -= 1

    def _require_initialized(self) -> None:
        if not self._initialized:
            raise RuntimeError("RemoteSGLangEngine is not initialized; call engine.initialize() first")

    def _tp_size(self) -> int:
        if self.config.sglang.tp_size:
            return self.config.sglang.tp_size
        from areal.config.parallel import ParallelStrategyError, parse_parallel

        try:
            return parse_parallel(self._rcfg.backend, allowed_backends=("sglang",)).tp
        except ParallelStrategyError:
            return 1

    def get_version(self) -> int:
        return self.control.get_version()

    def batching_counters(self) -> dict[str, float]:
        """The built-in servers' work counters (/get_server_info "batching": forward passes,
        tokens, seconds), summed over servers; {} when a server does not report them (SGLang)
        or cannot be reached. Differences between two calls say what the servers did meanwhile."""
        total: dict[str, float] = {}
        if not self._server_programs or any(p != BUILTIN_SERVER for p in self._server_programs):
            return {}  # only the built-in server counts its work (no request per step for nothing)
        try:
            infos = fanout(self.addrs, lambda i, a: self._control.server_info(a))
        except RuntimeError as e:  # fanout's error, naming the servers that failed
            logger.debug("no batching counters: %s", e)
            return {}
        for info in infos:
            batching = info.get("batching") if isinstance(info, dict) else None
            if not isinstance(batching, dict):
                return {}
            for key in BATCHING_COUNTERS:
                total[key] = total.get(key, 0.0) + float(batching.get(key) or 0)
        return total

    # ---- rollout executor (AReaL-lite style front) ------------------------------------------

    @property
    def executor(self):
        """The RolloutExecutor over this engine, created on first use."""
        if self._executor is None:
            from areal.rollout.executor import RolloutExecutor

            self._executor = RolloutExecutor(self, self._rcfg, loop_scope=self.session_scope)
            self.control.add_listener(self._executor)  # no episode starts while the servers are paused
        return self._executor

    def session_scope(self, **session_kwargs):
        """The scope in which an event loop's requests share one HTTP session, with at most
        server_capacity connections to each server (areal.engine.sglang.http.shared_session;
        session_kwargs go to aiohttp.ClientSession)."""
        from areal.engine.sglang.http import shared_session

        return shared_session(limit_per_host=self.server_capacity or 0, **session_kwargs)

    def submit(self, data, workflow, should_accept=None) -> None:
        self.executor.submit(data, workflow, should_accept)

    def wait(self, count: int, timeout: float | None = None) -> dict:
        return self.executor.wait(count, timeout)

    def prepare_batch(self, dataloader, workflow, should_accept=None) -> dict:
        return self.executor.prepare_batch(dataloader, workflow, should_accept)

    def rollout_batch(self, data, workflow, should_accept=None) -> dict:
        return self.executor.rollout_batch(data, workflow, should_accept)

    def resume_state(self) -> LoaderPosition | None:
        """Where prepare_batch's dataloader should restart after a recovery (see
        RolloutExecutor.resume_state); None when no episode is in flight."""
        return self._executor.resume_state() if self._executor is not None else None


def request_retries(config) -> int:
    """rollout.request_retries; when the launcher restarts the run's failed servers
    (launcher.restart_failed_servers), at least enough retries to wait out a restart, which the
    launcher allows launcher.server_startup_timeout_s."""
    retries = config.rollout.request_retries
    launcher = config.launcher
    if launcher.restart_failed_servers and launcher.rollout_n_nodes > 0 and not config.rollout.server_addrs:
        retries = max(retries, retries_for(launcher.server_startup_timeout_s))
    return retries
