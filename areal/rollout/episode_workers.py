"""Worker processes that run a workflow's episodes off the trainer's GIL.

An agent episode is Python all the way down: the agent's own code, the openai client (httpx,
pydantic), the rollout proxy (aiohttp, the chat template, the tokenizer) and the engine's HTTP
client. Hundreds of them in the trainer's process took its GIL from the training thread: on one
H200 the agent recipe's recompute pass ran 5.4x slower per token than the RLVR recipe's. Here each
worker is a spawned process with its own event loop, its own client of the inference servers and
its own copy of the workflow; the trainer keeps what decides which sample is trained on:

    trainer (rank 0)                                  worker process (one or more)
    RolloutExecutor: admission under the staleness    receives ("run", id, record, seed, version),
      bound, submission order, pause, filters          runs workflow.arun_episode(engine, record)
    workflow.arun_episode -> EpisodeWorkers.run ----> on its loop, answers ("done", id, rows) or
      awaits the rows                                  ("failed", id, text naming the root cause)
    ServerControl pause / continue -> pause() /      its client's gate follows (acknowledged
      resume()                                        before the servers are paused)

Each worker's client counts its open /generate requests in a counter the trainer reads
(`open_requests`): an abort-mode pause drains them as it drains the trainer's own, and only once
all are answered asks the servers for retract instead of SGLang's abort, which would wait a
second for request handlers that still hold its model-update lock.

Version stamps come from the servers (per token), as in the trainer; the worker's client also
knows the trainer's weight version (each run message and every continue carry it) for the prefix
cache namespace and the servers that report none, and the LoRA adapter requests name.

A worker that dies fails the episodes it was running with an error that names it and its exit
code; the executor raises it as a RolloutError. Workers end with the trainer (lifetime.py) and on
`close()`: each closes its workflow (proxy, client) and its HTTP session, then exits.

Messages are pickled by `pickle` itself, not multiprocessing's ForkingPickler, so torch tensors
travel as bytes rather than as shared-memory handles that would outlive the message; CPU tensors
as their dtype, shape and raw bytes (`dumps`), which the trainer's reader thread loads in a
sixteenth of the time torch's own reduction takes.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from areal.utils.gc_freeze import freeze_long_lived_objects

logger = logging.getLogger(__name__)

ACK_TIMEOUT_S = 10.0  # a pause waits this long for each worker's gate to close
STOP_TIMEOUT_S = 30.0  # close() waits this long for a worker to exit before killing it
KILLED_TIMEOUT_S = 5.0  # a killed worker (or one whose pipe closed) is waited for this long
ELSEWHERE_POLL_S = 0.002  # how often a pause's drain reads the workers' open-request counters
REAP_TIMEOUT_S = 5.0  # collecting an ended worker's exit status (waitpid) takes at most this long


class RequestsOpenElsewhere:
    """The /generate requests the workers' clients have open (each counts in a shared counter,
    OpenRequests.share): what the trainer's abort-mode pause drains (ServerControl.watch_requests),
    since they hold SGLang's model-update lock as the trainer's own do. `counters` gives the
    counters to read now (those of live workers: a dead one's count would stay up)."""

    def __init__(self, counters: Callable[[], list[Any]]) -> None:
        self._counters = counters

    @property
    def count(self) -> int:
        return sum(c.value for c in self._counters())

    def wait_none(self, timeout: float) -> bool:
        """Read the counters every ELSEWHERE_POLL_S until all are 0, up to `timeout` seconds."""
        deadline = time.perf_counter() + max(timeout, 0.0)
        while self.count:
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            time.sleep(min(ELSEWHERE_POLL_S, left))
        return True


class EpisodeWorkerError(RuntimeError):
    """An episode failed in a worker process, or its worker did (the message says which)."""


@dataclass
class WorkerSpec:
    """What a worker process needs to build its client and its workflow (picklable)."""

    name: str
    make_workflow: Callable[[], Any]  # builds the in-process workflow (an importable callable)
    engine_class: type  # the trainer's InferenceEngine class, built again in the worker from config
    config: Any  # the ExperimentConfig of the trainer's engine, with its server program and pause mode
    addrs: list[str]
    version: int
    lora_name: str | None
    paused: bool
    open_requests: Any = None  # a multiprocessing.Value("i"): its client's open /generate requests
    open_files: int = 0  # descriptors the worker needs (areal.infra.sockets)
    open_files_keys: str = ""
    title: str = "areal-episodes"  # its kernel name, what `ps` and the launcher's errors show


@dataclass
class _Worker:
    name: str
    process: Any
    conn: Any
    open_requests: Any = None  # the Value its client counts its open requests in (the trainer's drain reads it)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = field(default_factory=dict)
    acks: dict[int, threading.Event] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)
    alive: bool = True
    fatal: str | None = None
    # Every status question to the process (join, exitcode, kill) goes through wait_exit / kill,
    # one thread at a time: multiprocessing's Process is not thread-safe there. When two threads
    # joined it at once (close() and the reader thread, as the worker exits), one reaped it
    # (waitpid) and the other got ECHILD, which Process reads as "still running": its join returned
    # at once, and until the first thread stored the status the worker looked alive and its
    # exitcode was None, so close() "killed" a worker that had exited by itself.
    reap_lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_exit(self, timeout: float) -> int | None:
        """The process's exit code once it has exited, waiting at most `timeout` s; None while it runs."""
        # the sentinel becomes readable as the process ends; waiting on it reaps nothing, so any
        # number of threads may wait here at once; collecting the status is one thread at a time
        ended = bool(multiprocessing.connection.wait([self.process.sentinel], max(0.0, timeout)))
        if not self.reap_lock.acquire(timeout=REAP_TIMEOUT_S):
            return None  # another thread's waitpid is stuck: not known to have exited
        try:
            # after the sentinel, join only collects the status of a process that is ending
            self.process.join(REAP_TIMEOUT_S if ended else 0.0)
            return self.process.exitcode
        finally:
            self.reap_lock.release()

    def exit_code(self) -> int | None:
        """The exit code now (None while the process runs), without waiting for it to exit."""
        return self.wait_exit(0.0)

    def kill(self) -> None:
        """SIGKILL, unless the process has been reaped already (its pid may name another by now)."""
        if not self.reap_lock.acquire(timeout=REAP_TIMEOUT_S):
            return  # another thread is collecting its status: it has ended
        try:
            if self.process.exitcode is None:
                self.process.kill()
        finally:
            self.reap_lock.release()


# A worker killed by a signal leaves its reward pool's named semaphores to the resource tracker it
# shares with the trainer. The tracker unlinks them when the trainer exits, and warns "There appear
# to be N leaked semaphore objects" as the last line of the trainer's log, under the error that
# already named the dead worker. The clean-up stays; the warning goes.
_TRACKER_WARNING_FILTER = "ignore:resource_tracker:UserWarning"


def start_resource_tracker_quietly() -> None:
    """Start this process's multiprocessing resource tracker, if it has none yet, without its
    leaked-semaphore warning.

    The tracker gets this interpreter's -W options (sys.warnoptions), so the filter goes there for
    the start. Not through os.environ: setenv beside threads that read the environment in C (the
    trainer's) is not thread-safe."""
    from multiprocessing import resource_tracker

    sys.warnoptions.append(_TRACKER_WARNING_FILTER)
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(_TRACKER_WARNING_FILTER)


def _send(conn, message: tuple, lock: threading.Lock) -> None:
    """One message on a pipe that several threads write to."""
    data = dumps(message)
    with lock:
        conn.send_bytes(data)


def dumps(message: Any) -> bytes:
    """`message` pickled, its CPU tensors as their raw bytes (see _TensorBytesPickler)."""
    buffer = io.BytesIO()
    _TensorBytesPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    return buffer.getvalue()


class _TensorBytesPickler(pickle.Pickler):
    """A plain tensor pickles through torch.save, and each of its storages unpickles through a
    torch.load of its own: an RLVR group of 8 answers (six tensors) took 0.35 ms to load on the
    trainer's reader thread, holding the GIL the training thread needs, and 0.22 ms to dump. As
    dtype, shape and bytes it takes 0.02 ms each way. Tensors off the CPU, with autograd history,
    sparse, quantized or of a subclass keep torch's own reduction."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")  # no torch imported, no tensor to find
        if torch is None or type(obj) is not torch.Tensor:
            return NotImplemented
        if obj.device.type != "cpu" or obj.requires_grad or obj.layout != torch.strided or obj.is_quantized:
            return NotImplemented
        raw = obj.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return _tensor_from_bytes, (obj.dtype, tuple(obj.shape), raw)


def _tensor_from_bytes(dtype, shape: tuple, raw: bytes):
    import torch

    if not raw:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)


class EpisodeWorkers:
    """`n` worker processes running episodes of the workflow `make_workflow()` builds, against the
    servers of `engine` (a RemoteSGLangEngine: its config, addresses and control)."""

    def __init__(
        self,
        make_workflow: Callable[[], Any],
        engine,
        n: int,
        *,
        name: str = "episode-worker",
        open_files: int = 0,
        open_files_keys: str = "",
        startup_timeout_s: float | None = None,
    ):
        if n < 1:
            raise ValueError(f"EpisodeWorkers needs at least one worker, got {n}")
        self.make_workflow, self.engine, self.n, self.name = make_workflow, engine, n, name
        self.open_files, self.open_files_keys = open_files, open_files_keys
        self.startup_timeout_s = startup_timeout_s or engine.config.rollout.setup_timeout_s
        self.stopped_timeout_s = engine.config.launcher.stopped_timeout_s
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()  # the worker list, each worker's pending table and alive flag
        self._start_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        # the workers' requests, which an abort-mode pause drains as it drains the trainer's own
        self.open_requests = RequestsOpenElsewhere(self._live_request_counters)

    # ---- lifecycle ----------------------------------------------------------------------------

    def _worker_config(self):
        """The trainer engine's config with what it resolved: the servers' program, pause mode and
        stream interval."""
        config = self.engine.config.model_copy(deep=True)
        config.rollout.pause_mode = self.engine.pause_mode
        config.rollout.stream_interval = self.engine.stream_interval
        if self.engine.server_kind is not None:
            config.rollout.server = self.engine.server_kind
        return config

    def start(self) -> None:
        """Spawn the workers and wait until each has connected to the servers (blocking)."""
        with self._start_lock:
            if self._workers or self._closed:
                return
            ctx = multiprocessing.get_context("spawn")
            start_resource_tracker_quietly()  # before the first spawn starts it
            control = self.engine.control
            workers = []
            for i in range(self.n):
                counter = ctx.Value("i", 0)
                spec = WorkerSpec(
                    name=f"{self.name}-{i}",
                    make_workflow=self.make_workflow,
                    engine_class=type(self.engine),
                    config=self._worker_config(),
                    addrs=list(self.engine.addrs),
                    version=self.engine.get_version(),
                    lora_name=control.lora_name,
                    paused=control.paused,
                    open_requests=counter,
                    open_files=self.open_files,
                    open_files_keys=self.open_files_keys,
                    title=f"areal-{self.name.removesuffix('-worker')}s",
                )
                ours, theirs = ctx.Pipe(duplex=True)
                process = ctx.Process(target=worker_main, args=(theirs, spec), name=spec.name, daemon=True)
                process.start()
                theirs.close()
                worker = _Worker(spec.name, process, ours, counter)
                threading.Thread(target=self._read, args=(worker,), name=f"{spec.name}-reader", daemon=True).start()
                workers.append(worker)
            with self._lock:
                self._workers = workers
            self._await_ready(workers)
            if self.stopped_timeout_s is not None:
                threading.Thread(target=self._watch_stopped, name=f"{self.name}-watch", daemon=True).start()
            control.add_listener(self)  # from here on every pause and continue reaches the workers
            control.watch_requests(self.open_requests)
            logger.info(
                "%d %s process(es) run the episodes: pids %s", self.n, self.name, [w.process.pid for w in workers]
            )

    def _await_ready(self, workers: list[_Worker]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        for w in workers:
            w.ready.wait(max(0.0, deadline - time.monotonic()))
            problem = w.fatal or (None if w.alive else f"{_exit_text(w)} before it was ready")
            if problem is not None and not w.fatal:  # it died before worker_main could say why
                problem += (
                    " (its traceback is on this process's stderr; a script that starts workers needs "
                    "`if __name__ == '__main__':`, since a spawned process imports the script's main module)"
                )
            if problem is None and not w.ready.is_set():
                problem = (
                    f"not ready within {self.startup_timeout_s:.0f} s (rollout.setup_timeout_s): it imports the "
                    "workflow and connects to the servers first"
                )
            if problem is not None:
                self.close()
                raise EpisodeWorkerError(f"{w.name} (pid {w.process.pid}) could not start: {problem}")

    def close(self) -> None:
        """Stop every worker: each closes its workflow and client, then exits (killed past
        STOP_TIMEOUT_S). Episodes still running fail. Safe to call twice."""
        with self._lock:
            self._closed = True
            workers = list(self._workers)
        self.engine.control.remove_listener(self)
        self.engine.control.unwatch_requests(self.open_requests)
        for w in workers:
            if w.alive:
                try:
                    _send(w.conn, ("stop",), w.send_lock)
                except OSError:
                    pass
        start = time.monotonic()
        deadline = start + STOP_TIMEOUT_S
        for w in workers:
            if w.wait_exit(max(0.0, deadline - time.monotonic())) is None:
                logger.warning(
                    "%s (pid %d) did not stop within %.0f s: killed", w.name, w.process.pid, time.monotonic() - start
                )
                w.kill()
                if w.wait_exit(KILLED_TIMEOUT_S) is None:
                    logger.error("%s (pid %d) still runs %.0f s after SIGKILL", w.name, w.process.pid, KILLED_TIMEOUT_S)
            w.conn.close()

    def _live_request_counters(self) -> list[Any]:
        with self._lock:
            return [w.open_requests for w in self._workers if w.alive and w.open_requests is not None]

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def exit_codes(self) -> list[int | None]:
        """Each worker's exit code (None while it runs)."""
        return [w.exit_code() for w in self._workers]

    def running(self) -> int:
        """Episodes sent to the workers and not answered yet."""
        with self._lock:
            return sum(len(w.pending) for w in self._workers)

    # ---- episodes -----------------------------------------------------------------------------

    async def run(self, data: Any, seed: int | None) -> Any:
        """The episode's result (what the workflow's arun_episode returns), run in a worker."""
        if not self._workers:
            await asyncio.to_thread(self.start)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        episode_id = next(self._ids)
        with self._lock:
            live = [w for w in self._workers if w.alive]
            if self._closed or not live:
                raise EpisodeWorkerError(self._gone_text())
            worker = min(live, key=lambda w: len(w.pending))
            worker.pending[episode_id] = (loop, future)
        try:
            _send(worker.conn, ("run", episode_id, data, seed, self.engine.get_version()), worker.send_lock)
            return await future
        except asyncio.CancelledError:
            if worker.alive:
                try:
                    _send(worker.conn, ("cancel", episode_id), worker.send_lock)
                except OSError:
                    pass
            raise
        finally:
            with self._lock:
                worker.pending.pop(episode_id, None)

    def _gone_text(self) -> str:
        if self._closed:
            return f"the {self.name} processes were closed"
        return f"every {self.name} process has exited: " + "; ".join(_exit_text(w) for w in self._workers)

    # ---- the generation gate (a ServerControl listener) ---------------------------------------

    def pause(self) -> int:
        """Close every worker's gate and wait (ACK_TIMEOUT_S) until each says it did: from then on
        an aborted request waits there for continue. Returns how many workers confirmed."""
        waits = self._gate(True)
        deadline = time.monotonic() + ACK_TIMEOUT_S
        confirmed = 0
        for w, event in waits:
            if event.wait(max(0.0, deadline - time.monotonic())) and w.alive:
                confirmed += 1
            elif w.alive:
                logger.warning(
                    "%s (pid %d) did not confirm the pause within %.0f s; its requests may reach paused servers",
                    w.name,
                    w.process.pid,
                    ACK_TIMEOUT_S,
                )
        return confirmed

    def resume(self) -> None:
        """Open the gates, with the version the servers now serve and the adapter to name."""
        self._gate(False)

    def _gate(self, paused: bool) -> list[tuple[_Worker, threading.Event]]:
        control = self.engine.control
        seq = next(self._ids)
        message = ("gate", seq, paused, control.get_version(), control.lora_name)
        waits = []
        with self._lock:
            workers = [w for w in self._workers if w.alive]
        for w in workers:
            event = threading.Event()
            w.acks[seq] = event
            try:
                _send(w.conn, message, w.send_lock)
            except OSError:
                continue  # dead: its reader fails what it ran
            waits.append((w, event))
        return waits

    # ---- a stopped worker is killed and named ----------------------------------------------------

    def _watch_stopped(self) -> None:
        """A worker left in the stopped state (SIGSTOP) past launcher.stopped_timeout_s would hold
        its episodes, and the run, for ever: kill it, so that they fail with its name."""
        import psutil

        since: dict[int, float] = {}
        while not self._closed:
            with self._lock:
                workers = [w for w in self._workers if w.alive]
            for w in workers:
                try:
                    stopped = psutil.Process(w.process.pid).status() == psutil.STATUS_STOPPED
                except psutil.Error:
                    stopped = False
                if not stopped:
                    since.pop(w.process.pid, None)
                    continue
                first = since.setdefault(w.process.pid, time.monotonic())
                if time.monotonic() - first >= self.stopped_timeout_s:
                    w.fatal = (
                        f"was stopped (SIGSTOP) for {self.stopped_timeout_s:g} s (launcher.stopped_timeout_s) "
                        "and killed"
                    )
                    w.kill()
            time.sleep(0.5)

    # ---- the reader thread of each worker -----------------------------------------------------

    def _read(self, w: _Worker) -> None:
        while True:
            try:
                message = pickle.loads(w.conn.recv_bytes())
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "done":
                self._settle(w, message[1], message[2], None)
            elif kind == "failed":
                self._settle(w, message[1], None, EpisodeWorkerError(message[2]))
            elif kind == "ack":
                event = w.acks.pop(message[1], None)
                if event is not None:
                    event.set()
            elif kind == "ready":
                w.ready.set()
            elif kind == "fatal":
                w.fatal = message[1]
        self._on_exit(w)

    def _settle(self, w: _Worker, episode_id: int, result: Any, error: BaseException | None) -> None:
        with self._lock:
            entry = w.pending.pop(episode_id, None)
        if entry is None:
            return  # cancelled meanwhile
        loop, future = entry
        try:
            loop.call_soon_threadsafe(_resolve, future, result, error)
        except RuntimeError:  # the waiting loop is gone
            pass

    def _on_exit(self, w: _Worker) -> None:
        """The worker's pipe closed: it exited. Fail what it ran, naming it and its exit code."""
        w.wait_exit(KILLED_TIMEOUT_S)
        with self._lock:
            w.alive = False
            pending, w.pending = w.pending, {}
            closing = self._closed
        for event in w.acks.values():
            event.set()
        w.ready.set()
        if not pending:
            return
        text = f"{w.name} (pid {w.process.pid}) {_exit_text(w)} while running this episode"
        if not closing:
            logger.error("%s; %d episodes lost with it", text, len(pending))
        for loop, future in pending.values():
            try:
                loop.call_soon_threadsafe(_resolve, future, None, EpisodeWorkerError(text))
            except RuntimeError:
                pass


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _exit_text(w: _Worker) -> str:
    code = w.exit_code()
    if w.fatal and w.fatal.startswith("was stopped"):
        return w.fatal
    if w.fatal:
        return f"failed: {w.fatal}"
    if code is None:
        return "closed its pipe"
    if code < 0:
        import signal

        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


# ---- the worker process ---------------------------------------------------------------------------


def worker_main(conn, spec: WorkerSpec) -> None:
    """Entry of a worker process: build the client and the workflow, then run episodes until told
    to stop (or until the trainer is gone)."""
    from areal.infra.log_format import setup_process_logging
    from areal.infra.sockets import raise_open_file_limit
    from areal.utils.errors import describe_failure
    from areal.utils.lifetime import exit_now, exit_with_parent
    from areal.utils.proc_name import set_process_name

    exit_with_parent()
    set_process_name(spec.title)
    # Daemonic to the trainer (its exit ends the worker, never waits on it), but a workflow may
    # start processes of its own here (RLVR's reward pool): each exits with this one (exit_with_parent)
    multiprocessing.current_process().daemon = False
    setup_process_logging(stream=sys.stderr)
    lock = threading.Lock()
    code = 0
    try:
        raise_open_file_limit(spec.open_files, what=spec.name, keys=spec.open_files_keys)
        asyncio.new_event_loop().run_until_complete(_serve(conn, spec, lock))
    except BaseException as exc:
        logger.exception("%s failed", spec.name)
        try:
            _send(conn, ("fatal", describe_failure(exc)), lock)
        except OSError:
            pass
        code = 1
    # _serve closed what matters (episodes, proxy, clients, sessions) in order; the interpreter's
    # own teardown (asyncio.run cancelling what libraries left on the loop) once held a worker
    # past close()'s 30 s at 2,048 connections, so the worker ends here
    exit_now(code)


async def _serve(conn, spec: WorkerSpec, lock: threading.Lock) -> None:
    engine = await asyncio.to_thread(_connect, spec)
    try:
        worker = _WorkerLoop(conn, lock, spec.name, engine, await asyncio.to_thread(spec.make_workflow))
        threading.Thread(target=worker.read, name=f"{spec.name}-reader", daemon=True).start()
        async with engine.session_scope():
            freeze_long_lived_objects()  # the client, the workflow and their libraries: built now
            _send(conn, ("ready", os.getpid()), lock)
            await worker.run()
        await _cancel_leftovers(spec.name)
    finally:
        engine.destroy()


def _connect(spec: WorkerSpec):
    """The worker's own client of the trainer's servers, at the trainer's version and gate."""
    config = spec.config.model_copy(deep=True)
    config.rollout.server_addrs = list(spec.addrs)
    engine = spec.engine_class(config)
    engine.initialize(served_version=spec.version)
    engine.control.lora_name = spec.lora_name
    engine.control.follow_gate(spec.paused)
    if spec.open_requests is not None and hasattr(engine, "open_requests"):
        engine.open_requests.share(spec.open_requests)  # the trainer's abort-mode pause drains them
    return engine


class _WorkerLoop:
    """A worker's episodes: the trainer's messages in, each episode's answer out."""

    def __init__(self, conn, lock: threading.Lock, name: str, engine, workflow):
        self.conn, self.lock, self.name = conn, lock, name
        self.engine, self.control, self.workflow = engine, engine.control, workflow
        self.loop = asyncio.get_running_loop()
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.tasks: dict[int, asyncio.Task] = {}

    def read(self) -> None:
        """Gate messages are applied here at once (the trainer waits for the ack); the others go to
        the loop."""
        while True:
            try:
                message = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                message = ("stop",)
            if message[0] == "gate":
                if self._follow_gate(message):
                    continue
                message = ("stop",)  # the trainer is gone
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, message)
            if message[0] == "stop":
                return

    def _follow_gate(self, message: tuple) -> bool:
        """Apply a gate message and acknowledge it; False when the trainer is gone."""
        _, seq, paused, version, lora_name = message
        if not paused:
            self.control.set_version(version)
            self.control.lora_name = lora_name
        self.control.follow_gate(paused)
        try:
            _send(self.conn, ("ack", seq), self.lock)
        except OSError:
            return False
        return True

    async def run(self) -> None:
        """Start, cancel and stop episodes as the trainer says, until it says stop."""
        while True:
            message = await self.inbox.get()
            if message[0] == "run":
                _, episode_id, data, seed, version = message
                if version > self.control.get_version():
                    self.control.set_version(version)
                self.tasks[episode_id] = self.loop.create_task(self._episode(episode_id, data, seed))
            elif message[0] == "cancel":
                task = self.tasks.get(message[1])
                if task is not None:
                    task.cancel()
            elif message[0] == "stop":
                break
        for task in list(self.tasks.values()):
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        await self.workflow.aclose()

    async def _episode(self, episode_id: int, data: Any, seed: int | None) -> None:
        from areal.rollout.seeds import set_episode_seed
        from areal.utils.errors import describe_failure

        set_episode_seed(seed)  # this task's own context
        try:
            answer = ("done", episode_id, await self.workflow.arun_episode(self.engine, data))
        except asyncio.CancelledError:
            return  # the trainer cancelled it, or the worker stops: nobody waits for an answer
        except Exception as exc:
            logger.warning("%s: an episode failed", self.name, exc_info=True)
            answer = ("failed", episode_id, describe_failure(exc))
        finally:
            self.tasks.pop(episode_id, None)
        try:
            _send(self.conn, answer, self.lock)
        except pickle.PicklingError as exc:
            _send(self.conn, ("failed", episode_id, f"its result cannot be sent to the trainer: {exc}"), self.lock)


async def _cancel_leftovers(name: str, timeout: float = 5.0) -> None:
    """Cancel the tasks libraries left on the loop; name those that outlive `timeout`."""
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        _, pending = await asyncio.wait(leftovers, timeout=timeout)
        if pending:
            logger.warning("%s: %d tasks did not end when cancelled: %s", name, len(pending), list(pending)[:3])
