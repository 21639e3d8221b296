"""The rollout executor: runs workflow episodes asynchronously under a staleness bound.

Why a background thread with its own event loop (as AReaL's WorkflowExecutor): the trainer's
main thread is busy with forward/backward passes; episodes (HTTP generation + reward scoring)
must keep running meanwhile so the next batch is ready when the trainer asks for it.

    executor = RolloutExecutor(engine, cfg.rollout)
    batch = executor.prepare_batch(dataloader, workflow)   # async RL: keeps the pipeline full
    batch = executor.rollout_batch(records, workflow)      # sync: exactly these records
    executor.submit(record, workflow); batch = executor.wait(count=8, timeout=60)

Admission: a submitted episode starts only when `staleness.capacity` allows it, i.e. running +
accepted never exceeds `(max_head_offpolicyness + version + 1) * consumer_batch_size` and running
never exceeds `max_concurrent_rollouts`; the version is read from the engine, so the bound opens
as soon as the trainer sets a new version.

`pause()` stops admission (running episodes go on; the engine decides what happens to their
requests) until `resume()`.

Consumption is in submission order: `wait` hands out an accepted episode only once every episode
submitted before it has finished. With admission in the same order, the k-th consumed episode
started when at most (max_head_offpolicyness + v + 1) * batch episodes had, so it is trained at
version v + max_head_offpolicyness at the latest: the bound holds for every sample. Taking episodes
as they finished (as before) let a long answer started early reach the trainer many versions
later (staleness 5 with a bound of 1 in a SmolLM2 run), and fed short answers first. The same
order gives `resume_state`, the dataloader position a recovered run restarts from.

Filtering (`should_accept`, e.g. dynamic sampling's zero-variance check): a rejected episode counts
as not accepted, so the staleness bound admits a replacement at once and `prepare_batch` pulls
more records until the batch is full; its record is no longer in flight for `resume_state`. For
bounded episodes at most `max_overgeneration * consumer_batch_size` rejections are honoured
between two handed-out batches; past that, episodes are kept as they come (and a warning names
rollout.max_overgeneration) so a task whose groups all look alike cannot stall the run.
`last_batch_stats()` says, for the batch last handed out, how many groups were dropped among the
episodes submitted for it (exact: they all finished before it was handed out).

Record ids: when the dataloader can name its records (`record_id(record)`, as PromptLoader does:
the record's index in the dataset), every row of a batch from `wait`/`prepare_batch` carries its
episode's record as `record_id` (int64 [B]; -1 for an episode submitted without one), so the
trainer can say which prompts each step trained on (RUN/prompts.jsonl).

Sampling seeds (areal/rollout/seeds.py): every episode runs with a seed that a workflow turns
into one `sampling_seed` per request, so what it samples does not depend on which requests the
servers batched together. prepare_batch derives it from the record's place in the data stream
(the dataloader's `seed`, epoch, batch and offset, when it has positions; otherwise from the
submission order), `submit` from the submission order, and rollout_batch takes them as `seeds`
(none by default: evaluations are greedy).

A failing workflow raises `RolloutError` (with the data record attached) from the next `wait`,
`prepare_batch` or `rollout_batch`; it never leaves a caller waiting for a result that will not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from areal.api.inference import InferenceEngine
from areal.api.source import LoaderPosition
from areal.api.workflow import RolloutWorkflow
from areal.rollout.batch import concat_padded
from areal.rollout.seeds import mix, set_episode_seed
from areal.rollout.staleness import capacity
from areal.utils.errors import describe_failure

logger = logging.getLogger(__name__)

_POLL_S = 0.05  # admission re-check period (the engine's version can change at any time)
_PREPARE_WAIT_S = 0.5  # prepare_batch tops up the queue at least this often
STALL_NOTICE_S = 60.0  # a wait for rollouts this long without one finishing is reported
STALL_WARNING_S = 60.0  # prepare_batch says why it waits after this long with nothing running


class RolloutError(RuntimeError):
    """A workflow episode failed; `.data` is its input record, `__cause__` the original error. The
    workflow is named by its `workflow_name` where it has one (a wrapper names what it runs)."""

    def __init__(self, data: Any, workflow: Any, error: BaseException):
        self.data = data
        self.error = error
        text = repr(data)
        text = text if len(text) <= 500 else text[:500] + "..."
        name = getattr(workflow, "workflow_name", None) or type(workflow).__name__
        super().__init__(f"workflow {name} failed on record {text}: {describe_failure(error)}")


@dataclass
class _Submission:
    data: Any
    workflow: RolloutWorkflow
    should_accept: Callable[[dict], bool] | None
    sink: queue.Queue
    bounded: bool  # counts against the staleness bound (rollout_batch's episodes do not)
    created: float = field(default_factory=time.monotonic)
    seq: int = -1  # submission order of bounded episodes (set by _enqueue)
    origin: LoaderPosition | None = None  # prepare_batch: where in the dataloader the record came from
    record_id: int | None = None  # prepare_batch: the record's id from the dataloader, if it has ids
    seed: int | None = None  # the episode's sampling seed (None for a bounded one: from its seq)


@dataclass
class _Result:
    created: float
    seq: int
    data: Any
    workflow: RolloutWorkflow
    trajectory: dict | None  # None: dropped by the workflow or should_accept
    error: BaseException | None = None
    dropped_rows: int | None = None  # rejected by should_accept: how many samples it held
    kept_past_limit: bool = False  # rejected, but kept because max_overgeneration was reached
    record_id: int | None = None


class RolloutExecutor:
    def __init__(self, engine: InferenceEngine, config, loop_scope=None):
        """`config` is a RolloutConfig (rollout section of the experiment config); `loop_scope`,
        if given, is an async context manager factory entered around the executor's event loop
        (RemoteSGLangEngine shares one HTTP session among its episodes this way)."""
        if config.consumer_batch_size is None:
            raise ValueError(
                "rollout.consumer_batch_size is null: set it (or train_dataset.batch_size, "
                "which it follows after validate_config)"
            )
        self.engine = engine
        self._loop_scope = loop_scope
        self.consumer_batch_size = config.consumer_batch_size
        self.max_concurrent = config.max_concurrent_rollouts or config.consumer_batch_size
        self.max_head_offpolicyness = config.max_head_offpolicyness
        self._lock = threading.Lock()
        self._inputs: deque[_Submission] = deque()
        self._outputs: queue.Queue = queue.Queue()
        self._ready: list[_Result] = []  # accepted, finished, not yet consumed; by seq
        self._seq = itertools.count()
        self._unfinished: set[int] = set()  # seqs of bounded episodes queued or running
        self._origins: dict[int, LoaderPosition] = {}  # seq -> dataloader position, until the trainer has it
        self._running = 0  # every running episode (the concurrency bound)
        self._running_bounded = 0  # running episodes under the staleness bound
        self._accepted = 0  # accepted episodes under the staleness bound, ever
        self._peak = {"running": 0, "started": 0}  # observed maxima, for tests and logs
        # seconds the staleness bound held queued episodes back, and those of them with nothing
        # running (the servers idle for want of a newer version); the current state since when
        self._bound_s = {"held_s": 0.0, "idle_s": 0.0}
        self._bound_state, self._bound_since = (False, False), time.monotonic()
        self._order_wait_s = 0.0  # seconds `wait` held a batch back only for the submission order
        # filtering: rejections honoured between two handed-out batches, at most max_dropped
        self.max_overgeneration = config.max_overgeneration
        self.max_dropped = int(config.max_overgeneration * config.consumer_batch_size)
        self._dropped_since_batch = 0
        self._limit_warned = False  # warned about max_overgeneration since the last batch
        self._rejected: list[_Result] = []  # rejected, finished, not yet counted in a batch's stats
        self._last_batch_stats: dict[str, int] = {}
        self._paused = threading.Event()
        self._stopping = False
        self._data_iter: Iterable | None = None
        self._data_source: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._loop_error: BaseException | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, args=(started,), name="rollout-executor", daemon=True)
        self._thread.start()
        started.wait()

    # ---- public API -------------------------------------------------------------------------

    def submit(self, data: Any, workflow: RolloutWorkflow, should_accept: Callable[[dict], bool] | None = None) -> None:
        """Queue one episode; it starts when the staleness and concurrency bounds allow."""
        self._enqueue(_Submission(data, workflow, should_accept, self._outputs, bounded=True))

    def wait(self, count: int, timeout: float | None = None) -> dict[str, Any]:
        """The next `count` accepted episodes in submission order, as one padded batch.

        An episode is handed out only after every episode submitted before it has finished
        (see the module docstring: this keeps each sample within the staleness bound).
        Raises TimeoutError if fewer are ready within `timeout` seconds (those that are stay
        for the next call), and RolloutError as soon as an episode failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        held_by_order_since = None  # when `count` episodes had finished, but not the oldest ones
        try:
            while True:
                with self._lock:
                    frontier = min(self._unfinished, default=None)  # oldest episode still out
                self._collect_finished()
                ready = len(self._ready) if frontier is None else sum(r.seq < frontier for r in self._ready)
                if ready >= count:
                    taken, self._ready = self._ready[:count], self._ready[count:]
                    with self._lock:
                        for r in taken:
                            self._origins.pop(r.seq, None)
                        self._dropped_since_batch, self._limit_warned = 0, False
                    self._count_batch(taken)
                    return concat_padded(_with_record_ids(taken))
                if held_by_order_since is None and len(self._ready) >= count:
                    held_by_order_since = time.monotonic()
                self._keep(self._next_result(self._outputs, deadline, count, ready))
        finally:
            if held_by_order_since is not None:
                self._order_wait_s += time.monotonic() - held_by_order_since

    def _collect_finished(self) -> None:
        """Move every result already queued into `_ready` (raises on a failed episode)."""
        while True:
            try:
                result = self._outputs.get_nowait()
            except queue.Empty:
                return
            self._keep(result)

    def _keep(self, result: _Result) -> None:
        if result.error is not None:
            raise RolloutError(result.data, result.workflow, result.error) from result.error
        if result.trajectory is not None:
            self._ready.append(result)
            self._ready.sort(key=lambda r: r.seq)
        elif result.dropped_rows is not None:
            self._rejected.append(result)

    def _count_batch(self, taken: list[_Result]) -> None:
        """The filter's figures for a batch just handed out: the rejected episodes submitted before
        its last one (all finished by now) and not counted for an earlier batch."""
        if not taken:
            return
        last = taken[-1].seq
        dropped = [r for r in self._rejected if r.seq < last]
        self._rejected = [r for r in self._rejected if r.seq > last]
        self._last_batch_stats = {
            "groups": len(taken),
            "dropped_groups": len(dropped),
            "dropped_samples": sum(r.dropped_rows for r in dropped),
            "kept_past_limit": sum(r.kept_past_limit for r in taken),
        }

    def last_batch_stats(self) -> dict[str, int]:
        """For the batch `wait`/`prepare_batch` handed out last: `groups` (episodes in it),
        `dropped_groups` and `dropped_samples` (rejected by should_accept among the episodes
        submitted for it: generated beyond the batch), `kept_past_limit` (episodes in it that
        should_accept rejected but rollout.max_overgeneration kept). {} before the first batch."""
        return dict(self._last_batch_stats)

    def prepare_batch(
        self, dataloader: Iterable, workflow: RolloutWorkflow, should_accept: Callable[[dict], bool] | None = None
    ) -> dict[str, Any]:
        """One consumer batch, keeping enough episodes queued that generation never idles.

        `dataloader` yields batches (lists of records, or single dict records) and is cycled
        across epochs; episodes left running when this returns feed the next call (async RL).
        """
        if self._data_source is not dataloader:
            self._data_source, self._data_iter = dataloader, _cycle(dataloader)
        stalled_since = None
        while True:
            # one consumer batch queued beyond what may run: when this call returns, those episodes
            # start as soon as the staleness bound allows (during training in async RL), without
            # waiting for the next call; episodes that all finish together would otherwise leave
            # nothing running while the trainer trains
            while self._backlog() < self.max_concurrent + self.consumer_batch_size:
                batch = next(self._data_iter)
                where = _position_of_last_batch(dataloader)
                name = getattr(dataloader, "record_id", None)
                for offset, record in enumerate(_records(batch)):
                    origin = None if where is None else replace(where, offset=where.offset + offset)
                    place = None if origin is None else (origin.epoch, origin.position, origin.offset)
                    self._enqueue(
                        _Submission(
                            record,
                            workflow,
                            should_accept,
                            self._outputs,
                            bounded=True,
                            origin=origin,
                            record_id=None if name is None else name(record),
                            seed=None if place is None else mix(getattr(dataloader, "seed", 0), *place),
                        )
                    )
            try:
                return self.wait(self.consumer_batch_size, timeout=_PREPARE_WAIT_S)
            except TimeoutError:
                stalled_since = self._warn_if_held(stalled_since)

    def _warn_if_held(self, since: float | None) -> float | None:
        """Warn (every STALL_WARNING_S) when queued episodes cannot start because the staleness
        bound waits for a newer version: a loop that never advances it waits for ever, silently."""
        s = self.stats()
        if self.paused or s["running"] or not s["queued"]:
            return None
        now = time.monotonic()
        if since is None:
            return now
        if now - since < STALL_WARNING_S:
            return since
        version = self.engine.get_version()
        logger.warning(
            "prepare_batch has waited %.0fs: %d episodes are queued but none may start, because the "
            "staleness bound (rollout.max_head_offpolicyness=%d, consumer_batch_size %d) admits no "
            "more episodes at weight version %d. The version advances when the trainer updates the "
            "weights (engine.control.update_weights / set_version after each training step); a loop that "
            "never does this waits for ever.",
            now - since,
            s["queued"],
            self.max_head_offpolicyness,
            self.consumer_batch_size,
            version,
        )
        return now

    def count_trained_batches(self, batches: int) -> None:
        """A recovered run: the trainer trained on `batches` consumer batches before its checkpoint
        (one per weight version). Count them as accepted, so that at each version the staleness
        bound admits what it admitted in the interrupted run. Without this a run resumed at
        version v could start v more batches at once, samples up to v versions staler than
        rollout.max_head_offpolicyness allows. Call before any episode is submitted."""
        with self._lock:
            if self._accepted or self._inputs or self._running or self._ready:
                raise RuntimeError("count_trained_batches: episodes were already submitted; call it first")
            self._accepted = batches * self.consumer_batch_size
        self._poke()

    def resume_state(self) -> LoaderPosition | None:
        """The dataloader position (epoch, position, offset) of the oldest record whose episode
        the trainer has not received yet, or None when none is out (then the dataloader's own
        state is exact). A recovered run that loads it re-runs exactly the episodes in flight
        at the checkpoint: they were queued, running or finished but not trained on."""
        with self._lock:
            return self._origins[min(self._origins)] if self._origins else None

    def rollout_batch(
        self,
        data: list[Any],
        workflow: RolloutWorkflow,
        should_accept: Callable[[dict], bool] | None = None,
        seeds: list[int] | None = None,
    ) -> dict[str, Any]:
        """Run exactly these records and return their accepted episodes in input order;
        `seeds`: one sampling seed per record (default none: the servers' own generators).

        Synchronous (the caller waits, so no sample goes stale): only the concurrency bound
        applies. Dropped episodes are left out; {} if all were dropped.
        """
        sink: queue.Queue = queue.Queue()
        for record, seed in zip(data, seeds or [None] * len(data), strict=True):
            self._enqueue(_Submission(record, workflow, should_accept, sink, bounded=False, seed=seed))
        results = [self._next_result(sink, None, len(data)) for _ in data]
        for r in results:
            if r.error is not None:
                raise RolloutError(r.data, r.workflow, r.error) from r.error
        results.sort(key=lambda r: r.created)
        return concat_padded([r.trajectory for r in results if r.trajectory is not None])

    def pause(self) -> None:
        """Stop starting episodes (around weight updates); running ones continue."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()
        self._poke()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def stats(self) -> dict[str, int]:
        """Counters of the staleness bound (a snapshot)."""
        with self._lock:
            return {
                "queued": len(self._inputs),
                "running": self._running,
                "running_bounded": self._running_bounded,
                "accepted": self._accepted,
                "ready": len(self._ready),
                "peak_running": self._peak["running"],
                "peak_started": self._peak["started"],
            }

    def bound_seconds(self) -> dict[str, float]:
        """Cumulative seconds (from the executor's start) during which the staleness bound held
        queued episodes back (`held_s`), and those of them in which no episode ran at all
        (`idle_s`: the servers had no work because the next episodes wait for a newer weight
        version; raising rollout.max_head_offpolicyness would fill them). Pauses are not counted.
        Measured on the loop's wake-ups: exact to _POLL_S per change of state."""
        with self._lock:
            return self._clock_bound(time.monotonic())

    def order_wait_seconds(self) -> float:
        """Cumulative seconds `wait` held a batch back although enough accepted episodes had
        finished, because an older episode had not: the share of a rollout wait spent on the
        batch's own slowest episodes (long answers) rather than on generation throughput.
        Another order would rarely save it: with max_head_offpolicyness 1 a batch's episodes
        mostly started one version back, so they are due at this one (trained later, they would
        break the bound), and only an episode started at the current version could wait for the
        next batch in favour of one of its own version. Measured on result arrivals, so exact."""
        return self._order_wait_s

    def _clock_bound(self, now: float) -> dict[str, float]:
        """Add the time since the last change of state to its counters (under the lock)."""
        held, idle = self._bound_state
        elapsed, self._bound_since = now - self._bound_since, now
        self._bound_s["held_s"] += elapsed if held else 0.0
        self._bound_s["idle_s"] += elapsed if idle else 0.0
        return dict(self._bound_s)

    def _enter_bound_state(self, held: bool) -> None:
        """Clock the state so far, then enter this one: held, and idle where nothing runs (under the lock)."""
        self._clock_bound(time.monotonic())
        self._bound_state = (held, held and self._running == 0)

    def destroy(self) -> None:
        """Cancel running episodes and stop the loop thread."""
        self._stopping = True
        self._poke()
        self._thread.join(timeout=30)

    # ---- loop thread ------------------------------------------------------------------------

    def _thread_main(self, started: threading.Event) -> None:
        try:
            asyncio.run(self._main(started))
        except BaseException as e:  # surfaced to waiters by _next_result
            self._loop_error = e
            logger.exception("rollout executor loop died")
        finally:
            started.set()

    async def _main(self, started: threading.Event) -> None:
        async with self._loop_scope() if self._loop_scope else contextlib.nullcontext():
            await self._serve(started)

    async def _serve(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        tasks: set[asyncio.Task] = set()
        started.set()
        while not self._stopping:
            for sub in self._admit():
                task = asyncio.create_task(self._episode(sub))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            try:
                await asyncio.wait_for(self._wake.wait(), _POLL_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _admit(self) -> list[_Submission]:
        """Pop the queued episodes that may start now, updating the counters.

        FIFO, except that episodes outside the staleness bound (rollout_batch's) pass bounded ones
        that must wait for a newer version: the caller of rollout_batch (e.g. an evaluation
        before the next version bump) would otherwise wait for ever.
        """
        admitted = []
        if self._paused.is_set():
            with self._lock:
                self._enter_bound_state(held=False)  # a pause is not the bound's doing
            return admitted
        version = self.engine.get_version()
        with self._lock:
            waiting: deque[_Submission] = deque()  # bounded ones held back by the staleness bound
            while self._inputs and self._running < self.max_concurrent:
                sub = self._inputs.popleft()
                # once one bounded episode waits, the bounded ones behind it wait too (FIFO): no
                # need to ask the bound again for each (this runs each time an episode ends)
                if sub.bounded and (waiting or self._bounded_room(version) <= 0):
                    waiting.append(sub)
                    continue
                self._running += 1
                self._running_bounded += sub.bounded
                self._peak["running"] = max(self._peak["running"], self._running)
                self._peak["started"] = max(self._peak["started"], self._running_bounded + self._accepted)
                admitted.append(sub)
            held = bool(waiting)  # only bounded episodes the staleness bound held back are in it
            waiting.extend(self._inputs)
            self._inputs = waiting
            self._enter_bound_state(held)
        return admitted

    def _bounded_room(self, version: int) -> int:
        """Bounded episodes that may start now (areal.rollout.staleness.capacity); under the lock."""
        return capacity(
            version=version,
            max_head_offpolicyness=self.max_head_offpolicyness,
            consumer_batch_size=self.consumer_batch_size,
            max_concurrent=self.max_concurrent - (self._running - self._running_bounded),
            running=self._running_bounded,
            accepted=self._accepted,
        )

    async def _episode(self, sub: _Submission) -> None:
        trajectory, error, rejected, dropped_rows = None, None, None, None
        set_episode_seed(sub.seed)  # this task's own context: its requests' sampling seeds
        try:
            trajectory = await sub.workflow.arun_episode(self.engine, sub.data)
            if trajectory is not None and sub.should_accept is not None and not sub.should_accept(trajectory):
                trajectory, rejected, dropped_rows = None, trajectory, _n_rows(trajectory)
        except asyncio.CancelledError:
            error = RuntimeError("the rollout executor was destroyed while this episode ran")
            raise
        except Exception as e:
            error = e
        finally:
            kept_past_limit = warn = False
            with self._lock:
                if rejected is not None and error is None and sub.bounded:
                    if self._dropped_since_batch >= self.max_dropped:  # over-generation bound reached
                        trajectory, dropped_rows, kept_past_limit = rejected, None, True
                        warn, self._limit_warned = not self._limit_warned, True
                    else:
                        self._dropped_since_batch += 1
                self._running -= 1
                if sub.bounded:
                    self._running_bounded -= 1
                    self._accepted += trajectory is not None and error is None
                # under the lock: once a seq leaves _unfinished its result is already queued
                self._unfinished.discard(sub.seq)
                if trajectory is None and error is None:
                    self._origins.pop(sub.seq, None)  # dropped: nothing to redo after recovery
                sub.sink.put(
                    _Result(
                        sub.created,
                        sub.seq,
                        sub.data,
                        sub.workflow,
                        trajectory,
                        error,
                        dropped_rows=dropped_rows,
                        kept_past_limit=kept_past_limit,
                        record_id=sub.record_id,
                    )
                )
            if warn:
                logger.warning(
                    "%d groups were dropped since the last batch (should_accept, e.g. rollout.dynamic_sampling), "
                    "the bound rollout.max_overgeneration=%g x consumer_batch_size %d: the next groups are kept "
                    "whatever their rewards until this batch is handed out. If this repeats, the prompts give "
                    "all-equal rewards too often: raise rollout.max_overgeneration, change the data or "
                    "gconfig.n_samples, or set rollout.dynamic_sampling=false.",
                    self.max_dropped,
                    self.max_overgeneration,
                    self.consumer_batch_size,
                )
            self._wake.set()

    # ---- helpers ----------------------------------------------------------------------------

    def _enqueue(self, sub: _Submission) -> None:
        if self._stopping:
            raise RuntimeError("the rollout executor was destroyed; create a new one")
        with self._lock:
            if sub.bounded:
                sub.seq = next(self._seq)
                if sub.seed is None:
                    sub.seed = mix(sub.seq)
                self._unfinished.add(sub.seq)
                if sub.origin is not None:
                    self._origins[sub.seq] = sub.origin
            self._inputs.append(sub)
        self._poke()

    def _poke(self) -> None:
        """Wake the loop from any thread (new work, resume, stop)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # loop closed between the check and the call
                pass

    def _backlog(self) -> int:
        with self._lock:
            return len(self._inputs) + self._running

    def _next_result(
        self, source: queue.Queue, deadline: float | None, count: int, ready: int | None = None
    ) -> _Result:
        """The next result from `source`; raises if the deadline passes or the loop died. Every
        STALL_NOTICE_S without a result, a warning says what is waited for (the console shows it
        between progress lines)."""
        since = notice_at = time.monotonic()
        while True:
            if time.monotonic() - notice_at >= STALL_NOTICE_S:
                notice_at = time.monotonic()
                s = self.stats()
                logger.warning(
                    "no rollout finished for %.0f s: %d of %d ready, %d running, %d queued, weight version %d%s. "
                    "The servers may be compiling kernels for a new batch shape (SGLang JIT-compiles on first "
                    "use) or be overloaded; their logs say which",
                    notice_at - since,
                    len(self._ready) if ready is None else ready,
                    count,
                    s["running"],
                    s["queued"],
                    self.engine.get_version(),
                    ", paused" if self.paused else "",
                )
            if self._loop_error is not None or not self._thread.is_alive():
                raise RuntimeError("the rollout executor loop has stopped") from self._loop_error
            wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if wait <= 0:
                s = self.stats()
                raise TimeoutError(
                    f"only {len(self._ready) if ready is None else ready} of {count} rollouts "
                    f"were ready in time "
                    f"(queued={s['queued']}, running={s['running']}, accepted={s['accepted']}, "
                    f"version={self.engine.get_version()}, paused={self.paused})"
                )
            try:
                return source.get(timeout=wait)
            except queue.Empty:
                continue


def _cycle(dataloader: Iterable):
    """Batches of `dataloader` forever, epoch after epoch."""
    for epoch in itertools.count():
        empty = True
        for batch in dataloader:
            empty = False
            yield batch
        if empty:
            raise ValueError(f"the dataloader yielded no batch in epoch {epoch}; check the dataset")


def _position_of_last_batch(dataloader) -> LoaderPosition | None:
    """(epoch, position, offset) of the batch a PromptLoader-like dataloader (state_dict() with
    epoch and position = batches handed out) has just yielded; offset is the batch's first record
    within its batch (non-zero right after resuming mid-batch). None for other dataloaders."""
    state = dataloader.state_dict() if hasattr(dataloader, "state_dict") else None
    if not isinstance(state, dict) or not {"epoch", "position"} <= state.keys():
        return None
    return LoaderPosition(
        epoch=int(state["epoch"]),
        position=int(state["position"]) - 1,
        offset=int(getattr(dataloader, "last_batch_offset", 0)),
    )


def _with_record_ids(taken: list[_Result]) -> list[dict]:
    """The trajectories, each with a `record_id` row tensor when any episode has an id."""
    if all(r.record_id is None for r in taken):
        return [r.trajectory for r in taken]
    import torch

    out = []
    for r in taken:
        rid = -1 if r.record_id is None else r.record_id
        out.append({**r.trajectory, "record_id": torch.full((_n_rows(r.trajectory),), rid, dtype=torch.long)})
    return out


def _n_rows(trajectory: dict) -> int:
    """Samples in a trajectory (its leading dimension)."""
    first = trajectory.get("rewards")
    if first is None:
        first = next(iter(trajectory.values()))
    return int(first.shape[0]) if first.dim() else 1


def _records(batch: Any) -> list[Any]:
    """A dataloader batch as a list of records (a lone dict record is a batch of one)."""
    if isinstance(batch, dict):
        return [batch]
    return list(batch)
