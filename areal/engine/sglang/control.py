"""ServerControl: the one object that orders pause, weight update, flush and continue.

    control = ServerControl(["127.0.0.1:30000"], pause_mode="abort")
    meta = WeightUpdateMeta("disk", version=1)
    with control.weight_update(meta) as sink:   # pause (pause_mode)
        sink.load_disk("/ckpt/v1")              # or sink.load_bucket(named_tensors), per bucket
    # leaving the block: flush the prefix cache where the pause allows it, record the version, continue

Every control route of a set of inference servers goes through here: generation control
(pause / continue), versions (/model_info), server information (/server_info), LoRA adapters,
the three weight loads (disk, distributed, tensor), the cache flush, memory hand-off (release /
resume) and profiling (start / stop a torch.profiler trace), with one retry and auth policy:
connection errors and 502/503/504 are retried `retries` times with backoff, every request carries
the bearer key, and any server's failure raises an error naming it. Payloads are built and
answers parsed by `protocol.py`; this module only sends them.

The pause mode is resolved once, before this object exists (areal.infra.pause explains each mode
and what it asks of the prefix cache), and passed in; the addresses and the mode never change
after. Weight loads never ask the server to flush: after a pause in abort mode this object flushes
through /flush_cache after the loads and before continue; after a pause that held requests it does
not flush at all. The flush follows the mode the pause in effect used: a time-shared step pauses
with abort before it releases the servers' memory, whatever pause_mode is.

RemoteSGLangEngine builds one once it has found its servers. The trainer's engine produces the
weights and pushes them into the WeightUpdate (a WeightSink, areal/api/weights.py); it never
pauses or continues the servers itself. The broadcast group of distributed updates belongs to this
object (broadcast.py) and is torn down by close().
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

from areal.api.weights import WeightUpdateMeta
from areal.engine.sglang import protocol
from areal.engine.sglang.gate import ContinueSignal
from areal.engine.sglang.http import ServerError, auth_headers, fanout, get_json, post_json
from areal.infra.discovery import normalize_addrs
from areal.infra.pause import PAUSE_MODES, flushes_after_update

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT_KEY = "rollout.control_timeout_s"
WEIGHT_TIMEOUT_KEY = "rollout.weight_update_timeout_s"
# a pause reads the servers' load first; that count is a metric, so a server slow to answer delays the
# pause by this much at most (or control_timeout_s, if shorter) and the count is left out
LOADS_TIMEOUT_S = 10.0
# how long an abort-mode pause waits for this process's aborted requests to come back before it asks
# the servers to pause anyway (SGLang's own wait then takes over, in steps of a second)
DRAIN_TIMEOUT_S = 2.0
DRAIN_RECHECK_S = 0.05  # how often the drain aborts again while requests are unanswered


class OpenRequests:
    """The /generate requests a client has posted and not yet had answered, across its threads.

    An abort-mode pause waits on it: SGLang 0.5.16's /pause_generation (mode abort) aborts every
    request, then checks whether a request handler still holds the model-update lock and, if one
    does, sleeps a whole second before it checks again (tokenizer_manager.pause_generation). Every
    pause that found generation running cost 1.0 s that way (one H100, launcher.mps, 2026-12-06).
    Once these requests are aborted and answered, a weight update's pause need not ask SGLang for
    abort at all (ServerControl._server_pause_mode)."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()
        self._shared: Any = None  # a multiprocessing Value another process's drain reads (share())

    def share(self, counter: Any) -> None:
        """Also count in `counter`, a multiprocessing.Value("i") that the process ordering the
        pause reads (areal.rollout.episode_workers.RequestsOpenElsewhere): an episode worker's
        client counts there."""
        self._shared = counter

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def posted(self) -> Iterator[None]:
        """Count one request from its POST until its answer (or error)."""
        with self._cond:
            self._count += 1
            self._add_shared(1)
        try:
            yield
        finally:
            with self._cond:
                self._count -= 1
                self._add_shared(-1)
                if self._count == 0:
                    self._cond.notify_all()

    def _add_shared(self, n: int) -> None:
        if self._shared is not None:
            with self._shared.get_lock():
                self._shared.value += n

    def wait_none(self, timeout: float) -> bool:
        """Wait until no request is open, up to `timeout` seconds; whether none is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count == 0, timeout=max(timeout, 0.0))


def pause_report(answers: list[Any]) -> dict[str, float]:
    """The servers' /pause_generation answers, summarised: the slowest server's own pause seconds
    and the requests aborted or held, summed (keys only where some server reported them)."""
    report: dict[str, float] = {}
    for answer in answers:
        if not isinstance(answer, dict):
            continue
        if isinstance(answer.get("pause_s"), (int, float)):
            report["server_pause_s"] = max(report.get("server_pause_s", 0.0), float(answer["pause_s"]))
        for key in ("requests_aborted", "requests_held"):
            if isinstance(answer.get(key), int):
                report[key] = report.get(key, 0) + answer[key]
    return report


def read_server_info(addr: str, get: Callable[[str, str], Any], routes: dict[str, str]) -> dict:
    """GET /server_info through `get(addr, route)`; servers without it (SGLang before 0.5.16's
    rename) answer the legacy /get_server_info, which `routes` then names for that server."""
    route = routes.get(addr, protocol.SERVER_INFO)
    try:
        return get(addr, route)
    except ServerError as e:
        if e.status != 404 or route == protocol.SERVER_INFO_LEGACY:
            raise
    routes[addr] = protocol.SERVER_INFO_LEGACY
    return get(addr, protocol.SERVER_INFO_LEGACY)


def read_server_infos(addrs: list[str], get: Callable[[str, str], Any], routes: dict[str, str]) -> list[dict | None]:
    """Every server's /server_info answer (read_server_info); None where it cannot be read."""

    def info(i, addr):
        try:
            answer = read_server_info(addr, get, routes)
        except (ServerError, OSError, ValueError) as e:
            logger.debug("cannot read %s's server info: %s", addr, e)
            return None
        return answer if isinstance(answer, dict) else None

    return fanout(addrs, info)


class ServerControl:
    """Control calls to `addrs` (host:port); see the module docstring.

    pause_mode: abort, retract or in_place, already resolved (areal.infra.pause.resolve_pause_mode).
    weight_timeout_s bounds each weight load (rollout.weight_update_timeout_s: a large model
    reloads for minutes); control_timeout_s every call that answers at once: pause, continue,
    information, flush, memory (rollout.control_timeout_s). A server that takes a request and
    never answers (stopped, hung) is named past them, with the key. ranks_per_server is each
    server's tensor-parallel size: a server takes that many ranks of a distributed update group
    and one tensor payload per rank.
    """

    def __init__(
        self,
        addrs: list[str],
        *,
        pause_mode: str,
        api_key: str | None = None,
        retries: int = 0,
        weight_timeout_s: float = 600.0,
        control_timeout_s: float = 60.0,
        ranks_per_server: int = 1,
        info_routes: dict[str, str] | None = None,
    ):
        if pause_mode not in PAUSE_MODES:
            raise ValueError(
                f"ServerControl needs a resolved pause mode, one of {PAUSE_MODES}, not {pause_mode!r} "
                "(areal.infra.pause.resolve_pause_mode resolves rollout.pause_mode=auto)"
            )
        self._addrs = tuple(normalize_addrs(addrs))
        self._pause_mode = pause_mode
        self.headers = auth_headers(api_key)
        self.retries = retries
        self.weight_timeout_s = weight_timeout_s
        self.control_timeout_s = control_timeout_s
        self.ranks_per_server = ranks_per_server
        self.lora_name: str | None = None  # the adapter /generate requests name (adapter pushes)
        self._paused = threading.Event()
        self._continued = ContinueSignal()  # wakes the answers aborted by a pause, at continue
        self._pause_used: str | None = None  # the mode of the pause in effect (None: not paused)
        self._broadcast: Any = None  # the BroadcastGroup of distributed updates, joined on first use
        self._lock = threading.Lock()
        self._version = 0
        self._listeners: list[Any] = []  # objects with pause() / resume(): they follow the gate
        self._open_requests: list[Any] = []  # what a pause drains: objects with count and wait_none()
        self._info_route = dict(info_routes or {})  # addr -> the server-info route it serves (legacy)
        self._loads_served = True  # False once a server has refused /v1/loads (older or other servers)
        self._bg = ThreadPoolExecutor(max_workers=4, thread_name_prefix="server-control")
        self._ahead: Future | None = None  # a pause started ahead of its weight update (pause_ahead)

    @property
    def addrs(self) -> list[str]:
        """The servers (host:port), fixed when the control is built."""
        return list(self._addrs)

    @property
    def pause_mode(self) -> str:
        """How the servers pause for a weight update, fixed when the control is built."""
        return self._pause_mode

    # ---- transport ----------------------------------------------------------------------------
    def post_all(self, route: str, body_of: Callable[[int, str], dict] | dict, *, weights: bool = False) -> list[Any]:
        """POST to every server at once (`body_of(index, addr)` or one shared body); all answers,
        or one error naming each server that failed. `weights`: a weight load (its deadline is
        weight_timeout_s, else control_timeout_s)."""
        make = body_of if callable(body_of) else (lambda i, a: body_of)
        timeout, key = (
            (self.weight_timeout_s, WEIGHT_TIMEOUT_KEY) if weights else (self.control_timeout_s, CONTROL_TIMEOUT_KEY)
        )
        return fanout(
            self.addrs,
            lambda i, a: post_json(
                a, route, make(i, a), timeout=timeout, retries=self.retries, headers=self.headers, timeout_key=key
            ),
        )

    def _checked(self, route: str, body_of, *, weights: bool = True) -> list[Any]:
        """post_all for routes that answer {"success": ..., "message": ...}."""
        answers = self.post_all(route, body_of, weights=weights)
        for answer in answers:
            protocol.parse_success(route, answer)
        return answers

    def get(self, addr: str, route: str) -> Any:
        return get_json(
            addr, route, timeout=self.control_timeout_s, headers=self.headers, timeout_key=CONTROL_TIMEOUT_KEY
        )

    def close(self) -> None:
        """Tear down the broadcast group (if any), then stop the background requests."""
        if self._broadcast is not None:
            try:
                self._broadcast.destroy()
            except Exception as exc:  # the servers may already be gone at shutdown
                logger.warning("destroying the weight update group failed: %s", exc)
            self._broadcast = None
        self._bg.shutdown(wait=False, cancel_futures=True)

    # ---- information --------------------------------------------------------------------------
    def server_info(self, addr: str) -> dict:
        """GET /server_info (the legacy /get_server_info on servers without it); see read_server_info."""
        return read_server_info(addr, self.get, self._info_route)

    def server_infos(self) -> list[dict | None]:
        """Every server's /server_info answer; None where it cannot be read."""
        return read_server_infos(self.addrs, self.get, self._info_route)

    def server_versions(self) -> dict[str, int | None]:
        """Each server's weight version from /model_info (/get_model_info on servers without it)."""
        return dict(zip(self.addrs, fanout(self.addrs, lambda i, a: self._model_info_version(a))))

    def _model_info_version(self, addr: str) -> int | None:
        try:
            body = self.get(addr, protocol.MODEL_INFO)
        except ServerError as e:
            if e.status != 404:
                raise
            body = self.get(addr, protocol.MODEL_INFO_LEGACY)
        return protocol.parse_model_info_version(body)

    # ---- the served version ---------------------------------------------------------------------
    def get_version(self) -> int:
        """The weight version the servers generate with (the last update's, or set_version's)."""
        with self._lock:
            return self._version

    def set_version(self, version: int) -> None:
        """Record the served version without an update (a fresh or recovered run whose servers
        already hold these weights). Tokens whose server reports no version are attributed to it."""
        with self._lock:
            self._version = int(version)

    # ---- the generation gate ------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    async def wait_continued(self) -> None:
        """On any event loop: return once generation may go on (at once when not paused). Woken at
        continue before the listeners resume, so what waits here is resubmitted before the rollout
        executor starts new episodes (areal/engine/sglang/gate.py says why that order matters)."""
        await self._continued.wait(self._paused.is_set)

    def add_listener(self, listener: Any) -> None:
        """`listener.pause()` / `.resume()` run with every pause and continue (the rollout
        executor stops starting episodes while the servers are paused)."""
        self._listeners.append(listener)
        if self.paused:
            listener.pause()

    def remove_listener(self, listener: Any) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def follow_gate(self, paused: bool) -> None:
        """Record that another process's control paused (or continued) these servers, without a
        request: an episode worker's client follows the trainer's gate this way, so that an aborted
        request waits for continue instead of being resubmitted to paused servers."""
        if paused:
            self._paused.set()
        else:
            self._paused.clear()
            self._pause_used = None
            self._continued.notify()

    def watch_requests(self, requests: Any) -> None:
        """An abort-mode pause aborts these requests and waits for their answers before it asks
        the servers to pause (see OpenRequests; anything with `count` and `wait_none(timeout)`,
        such as the episode workers' RequestsOpenElsewhere)."""
        self._open_requests.append(requests)

    def unwatch_requests(self, requests: Any) -> None:
        if requests in self._open_requests:
            self._open_requests.remove(requests)

    def pause(self, mode: str | None = None, *, then_release: bool = False) -> dict[str, float]:
        """Pause generation on every server (`mode`, default pause_mode); returns what the servers
        say it cost (see pause_report), `pause_request_s`, the /pause_generation round trip,
        `requests_in_flight`, the requests they ran or queued just before (see requests_in_flight),
        and in abort mode, where watched requests were open, `requests_drained` and `drain_s` (see
        drain), and `pause_sent_as_retract` (see _server_pause_mode). A time-shared step pauses
        with abort and `then_release` before it releases the servers' memory (SGLang releases only
        an idle server); the weight update that ends the step continues."""
        mode = mode or self.pause_mode
        self._paused.set()  # first: an aborted request must wait, not resubmit at once
        self._pause_used = mode
        for listener in self._listeners:
            listener.pause()
        in_flight = self.requests_in_flight()
        drained = self.drain() if mode == "abort" else {}
        server_mode = self._server_pause_mode(mode, then_release)
        t0 = time.perf_counter()
        report = pause_report(self.post_all(protocol.PAUSE, protocol.pause_payload(server_mode)))
        if server_mode != mode:
            # a request no watched client posted was retracted to the queue: abort it there, so
            # that nothing is held, as an abort-mode pause promises
            self.abort_all()
        if mode == "abort":
            report["pause_sent_as_retract"] = float(server_mode != mode)
        # the round trip: SGLang 0.5.16's abort pause sleeps a second at a time while a request
        # handler holds its model-update lock, and says nothing of it
        report["pause_request_s"] = time.perf_counter() - t0
        report.update(drained)
        if in_flight is not None:
            report["requests_in_flight"] = in_flight
        return report

    def _server_pause_mode(self, mode: str, then_release: bool) -> str:
        """The mode to ask the servers for. After a drain that got every watched request answered,
        an abort-mode pause for a weight update asks for retract, which holds nothing when nothing
        runs. SGLang 0.5.16's abort pause checks its model-update lock at once and, while any
        request handler still holds it, sleeps a whole second before checking again. A handler
        lets go of it only after its answer is sent (its generator is closed by a task of its
        own), so a pause posted a few milliseconds after the last answer may find some still held
        (1.003 s of /pause_generation in 2 of 12 updates, 2026-12-07; scripts/dev/
        pause_lock_race.py reproduces it). A pause before a memory release keeps SGLang's own
        abort, which waits until no handler is left: SGLang asserts when it must release with a
        request held."""
        if mode != "abort" or then_release or not self._open_requests:
            return mode
        return "retract" if all(r.count == 0 for r in self._open_requests) else mode

    def abort_all(self) -> None:
        """Abort every request the servers run or queue (/abort_request, abort_all); their clients
        get answers with finish_reason abort and the tokens so far."""
        self.post_all(protocol.ABORT, protocol.abort_all_payload())

    def drain(self) -> dict[str, float]:
        """Abort every request on the servers (/abort_request, abort_all) until the watched clients
        have their answers, for up to DRAIN_TIMEOUT_S; nothing when none is open. The abort is
        sent again every DRAIN_RECHECK_S: a request posted just before the gate closed may reach a
        server after the first one. The clients hold what comes back aborted until continue."""
        watched = list(self._open_requests)  # a pool of episode workers may leave meanwhile
        open_now = sum(r.count for r in watched)
        if open_now == 0:
            return {}
        t0 = time.perf_counter()
        deadline = t0 + min(DRAIN_TIMEOUT_S, self.control_timeout_s)
        rounds = 0
        while True:
            self.abort_all()
            rounds += 1
            step_end = min(time.perf_counter() + DRAIN_RECHECK_S, deadline)
            if all(r.wait_none(step_end - time.perf_counter()) for r in watched):
                break
            if time.perf_counter() >= deadline:
                logger.info(
                    "pause: %d aborted request(s) still unanswered after %.1f s; the servers' pause waits for them",
                    sum(r.count for r in watched),
                    time.perf_counter() - t0,
                )
                break
        return {"requests_drained": float(open_now), "drain_s": time.perf_counter() - t0, "drain_aborts": rounds}

    def pause_ahead(self) -> None:
        """Start the pause for the coming weight update now, in the background (rollout.
        pause_ahead_minibatches): the trainer's last minibatches then train while the servers pause
        (in abort mode, while the requests in flight are aborted and answered). weight_update waits for
        it instead of pausing. Nothing when the servers are paused already (a time-shared step)."""
        if self.paused or self._ahead is not None:
            return
        self._ahead = self._bg.submit(self._timed_pause)

    def _timed_pause(self) -> dict[str, float]:
        t0 = time.perf_counter()
        report = self.pause()
        report["pause_ahead_s"] = time.perf_counter() - t0
        return report

    def _await_pause_ahead(self) -> dict[str, float]:
        """The report of the pause pause_ahead started, once it is done (its own calls have deadlines;
        this bounds the wait for all of them together)."""
        ahead, self._ahead = self._ahead, None
        limit = LOADS_TIMEOUT_S + DRAIN_TIMEOUT_S + 2 * self.control_timeout_s
        try:
            return ahead.result(timeout=limit)
        except TimeoutError as e:
            raise RuntimeError(
                f"the pause started ahead of the weight update (rollout.pause_ahead_minibatches) did not "
                f"finish within {limit:g} s on {', '.join(self.addrs)}; raise {CONTROL_TIMEOUT_KEY} "
                f"(now {self.control_timeout_s:g}) or set rollout.pause_ahead_minibatches=0"
            ) from e

    def requests_in_flight(self) -> int | None:
        """Requests running or queued on the servers, summed over them (GET /v1/loads). On SGLang
        it is the schedulers' latest load snapshot (up to 15 decode steps old); it tells whether a
        pause mode acted at all, which SGLang's one weight version per answer hides. None when a
        server cannot say: after a server has refused the route it is not asked again."""
        if not self._loads_served:
            return None
        timeout = min(LOADS_TIMEOUT_S, self.control_timeout_s)

        def read(i: int, addr: str) -> int | None:
            try:
                return protocol.parse_loads(get_json(addr, protocol.LOADS, timeout=timeout, headers=self.headers))
            except ServerError as e:  # a missed reading, not a failed pause
                if e.status is not None and 400 <= e.status < 500:  # no such route there: ask no more
                    self._loads_served = False
                    logger.info("weight_update/requests_in_flight is not reported: %s", e)
                return None
            except ValueError:  # not JSON
                return None

        counts = fanout(self.addrs, read)
        return None if None in counts else sum(counts)

    def resume(self) -> None:
        self.post_all(protocol.CONTINUE, protocol.continue_payload())
        self._paused.clear()
        self._pause_used = None
        self._continued.notify()  # before the listeners: aborted answers go on ahead of new episodes
        for listener in self._listeners:
            listener.resume()

    def flush_cache(self) -> None:
        """Flush every server's prefix cache once it is idle. SGLang answers 400 while requests are
        pending (from 0.5.10 on after waiting up to `timeout` for them to drain); a refusal is asked
        again until control_timeout_s has passed, then it is an error naming the servers and the key.
        After an abort-mode pause nothing may be held, so each try first aborts whatever is (a
        request that reached a server after the pause's own abort, see _server_pause_mode): the
        server handles the abort before the flush, which then finds it idle at once."""
        deadline = time.monotonic() + self.control_timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            if self._pause_used == "abort":
                self.abort_all()
            try:
                self.post_all(protocol.flush_route(left / 2), {})
                return
            except RuntimeError as e:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the servers' prefix cache could not be flushed within {self.control_timeout_s:g} s "
                        f"({CONTROL_TIMEOUT_KEY}) after a weight update in pause mode {self._pause_used!r}: {e}"
                    ) from e
            time.sleep(0.2)

    # ---- weight updates -----------------------------------------------------------------------
    @contextlib.contextmanager
    def weight_update(self, meta: WeightUpdateMeta) -> Iterator[WeightUpdate]:
        """Pause (unless paused already; a pause that pause_ahead started is waited for), yield the
        WeightUpdate the weights are pushed into; after the loads, flush where the pause in effect
        allows it and record meta.version (None: keep the current one); always continue at the end,
        also when the caller paused earlier. `update.report` then holds the seconds of each stage
        (pause_s, flush_s, resume_s) and what the servers said the pause cost."""
        update = WeightUpdate(self, meta)
        t0 = time.perf_counter()
        if self._ahead is not None:  # started during training (pause_ahead): wait for what is left of it
            update.report.update(self._await_pause_ahead())
        elif not self.paused:
            update.report.update(self.pause())
        update.report["pause_s"] = time.perf_counter() - t0
        ok = False
        try:
            yield update
            self._finish(update)
            ok = True
        finally:
            t0 = time.perf_counter()
            try:
                self.resume()
            except Exception:
                if ok:
                    raise
                logger.exception("could not continue generation after a failed weight update")
            update.report["resume_s"] = time.perf_counter() - t0

    def _finish(self, update: WeightUpdate) -> None:
        """After the loads: flush where the pause allows it, then record the version."""
        if not update.loads:
            return
        if flushes_after_update(self._pause_used or self.pause_mode):
            t0 = time.perf_counter()
            self.flush_cache()
            update.report["flush_s"] = time.perf_counter() - t0
        if update.meta.version is not None:
            self.set_version(update.meta.version)

    def update_weights(self, meta: WeightUpdateMeta) -> list[dict]:
        """A whole disk update (meta.path; an adapter folder with meta.lora_name) in one call."""
        if meta.type != "disk":
            raise ValueError(
                f"update_weights takes disk updates, not {meta.type!r}: for tensor and distributed "
                "ones open control.weight_update(meta) and push the buckets into it"
            )
        with self.weight_update(meta) as update:
            if meta.lora_name is not None:
                return update.load_adapter(meta.path, meta.lora_name)
            return update.load_disk(meta.path)

    # the distributed update group lives across updates
    @property
    def group_world_size(self) -> int:
        """Ranks of a distributed update group: the trainer (rank 0) plus every server's ranks."""
        return 1 + len(self.addrs) * self.ranks_per_server

    def init_weights_update_group(self, meta: WeightUpdateMeta) -> Future:
        """Every server joins the trainer's broadcast group (server i owns ranks
        1 + i * ranks_per_server ...); resolves once all joined, which needs the trainer to join
        concurrently."""
        tp, world = self.ranks_per_server, self.group_world_size
        return self._bg.submit(
            self._checked,
            protocol.INIT_GROUP,
            lambda i, a: protocol.init_group_payload(meta, rank_offset=1 + i * tp, world_size=world),
        )

    def destroy_weights_update_group(self, meta: WeightUpdateMeta) -> Future:
        return self._bg.submit(self._checked, protocol.DESTROY_GROUP, protocol.destroy_group_payload(meta.group_name))

    def broadcast_group(self, meta: WeightUpdateMeta):
        """The broadcast group of distributed updates, joined with meta's rendezvous on first use."""
        if self._broadcast is None:
            from .broadcast import BroadcastGroup

            self._broadcast = BroadcastGroup(self, meta)
        return self._broadcast

    def announce_broadcast(self, meta: WeightUpdateMeta) -> Future:
        """Every server receives meta.names/dtypes/shapes from the trainer's broadcast in group
        meta.group_name; returns at once, the future resolves to the answers once they are loaded
        (the trainer broadcasts meanwhile)."""
        body = protocol.distributed_update_payload(meta)
        return self._bg.submit(self._checked, protocol.UPDATE_FROM_DISTRIBUTED, body)

    # ---- memory hand-off ----------------------------------------------------------------------
    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Servers free their KV cache and/or move their weights off the device (tags among
        kv_cache, weights; None: everything the server tags, on SGLang its cuda_graph too, which
        no tag here resumes); generation must be paused and idle."""
        self.post_all(protocol.RELEASE_MEMORY, protocol.memory_payload(tags, protocol.RELEASE_MEMORY), weights=True)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Servers take back what release_memory_occupation freed (a weight-sized copy: its deadline
        is weight_timeout_s)."""
        self.post_all(protocol.RESUME_MEMORY, protocol.memory_payload(tags, protocol.RESUME_MEMORY), weights=True)

    # ---- profiling ----------------------------------------------------------------------------
    def start_profile(self, output_dir_of: Callable[[int], str], profile_id: str, **options: bool) -> None:
        """Every server starts a torch.profiler trace (CPU and GPU) that stop_profile writes to
        output_dir_of(index)/{profile_id}-TP-{rank}.trace.json.gz on the server's machine; options:
        with_stack, record_shapes (protocol.start_profile_payload)."""
        self.post_all(
            protocol.START_PROFILE,
            lambda i, a: protocol.start_profile_payload(output_dir_of(i), profile_id, **options),
        )

    def stop_profile(self) -> None:
        """Every server stops its trace and writes it; the answer waits for the file, which for a
        long window takes as long as a weight load (its deadline is weight_timeout_s)."""
        self.post_all(protocol.STOP_PROFILE, {}, weights=True)


class WeightUpdate:
    """One weight update in progress, generation paused (ServerControl.weight_update): the
    WeightSink (areal/api/weights.py) the trainer pushes the new weights into, whole (disk, adapter)
    or bucket by bucket (tensor, distributed)."""

    def __init__(self, control: ServerControl, meta: WeightUpdateMeta):
        self.control = control
        self.meta = meta
        self.loads = 0
        self.report: dict[str, float] = {}
        self.folder: str | None = None

    def load_disk(self, path: str) -> list[dict]:
        """Every server loads the Hugging Face folder `path`."""
        if not path:
            raise ValueError("a disk weight update needs the saved Hugging Face folder (WeightUpdateMeta.path)")
        self.loads += 1
        answers = self.control._checked(
            protocol.UPDATE_FROM_DISK, protocol.disk_update_payload(path, self.meta.version)
        )
        self.folder = path
        return self._timed(answers)

    def load_adapter(self, path: str, name: str) -> list[dict]:
        """actor.lora_push=adapter: load the peft folder as `name`, take the version, switch
        requests to it and unload the previous adapter (no request names one that is gone)."""
        control = self.control
        self.loads += 1
        answers = control._checked(protocol.LOAD_LORA, protocol.load_lora_payload(name, path))
        if self.meta.version is not None:
            control._checked(protocol.UPDATE_WEIGHT_VERSION, protocol.weight_version_payload(self.meta.version))
        previous, control.lora_name = control.lora_name, name
        if previous is not None and previous != name:
            control._checked(protocol.UNLOAD_LORA, protocol.unload_lora_payload(previous))
        return answers

    def load_bucket(self, named_tensors: list) -> list[dict]:
        """One bucket of (HF name, full tensor) pairs: broadcast over the control's group
        (meta.type distributed), else copied by servers on the trainer's own device(s) through
        CUDA IPC handles (shared memory on CPU), every tensor-parallel rank of a server getting the
        full tensors. The tensors must stay alive until this returns."""
        self.loads += 1
        if self.meta.type == "distributed":
            return self._timed(self.control.broadcast_group(self.meta).send_bucket(named_tensors, self.meta.version))
        from areal.utils.tensor_ipc import serialize_named_tensors

        text = serialize_named_tensors(named_tensors)
        body = protocol.tensor_update_payload([text] * self.control.ranks_per_server, version=self.meta.version)
        return self._timed(self.control._checked(protocol.UPDATE_FROM_TENSOR, body))

    def _timed(self, answers: list[dict]) -> list[dict]:
        """Add the slowest server's reported seconds of applying one load to report["server_load_s"]
        (servers that report none count 0)."""
        seconds = [
            float(a["load_s"]) for a in answers if isinstance(a, dict) and isinstance(a.get("load_s"), (int, float))
        ]
        if seconds:
            self.report["server_load_s"] = self.report.get("server_load_s", 0.0) + max(seconds)
        return answers
