"""Continuous batching: one worker thread owns the model and steps every running sequence.

Why our own loop rather than transformers' `ContinuousBatchingManager`: in transformers 5 its
sampling processors and `do_sample` are fixed when the manager starts (per-request temperature
only if a temperature processor was created up front), and it has no notion of pausing with the
KV cache kept, retracting, or swapping weights between steps. The server needs all of those.

Each loop iteration (on the worker thread):
  1. take new requests, aborts and control commands from the inbox (thread-safe queue);
  2. run control commands (weight updates, pause/continue, ...) that may run now; a command
     marked `drain` waits, as in SGLang, until running requests have finished (admission stops
     meanwhile) unless generation is paused;
  3. unless paused or memory is released, admit waiting sequences (bounded by
     --max-running-requests, --max-prefill-tokens and the KV budget: the batch's worst-case cache,
     rows x the longest prompt + max_new_tokens, stays within max_total_num_tokens; see
     memory.py), prefill them together and merge them into the running batch;
  4. run one decode step for the whole batch, sample each row with its own parameters, and
     retire finished sequences (their callback fires on this thread).

Pause modes (SGLang's): `abort` is done by the HTTP layer (gate new requests, abort all);
`in_place` stops stepping and keeps the KV cache; `retract` also stops but drops the KV cache
and puts running sequences back at the head of the queue, so after `continue` they are
re-prefilled (prompt + tokens so far), i.e. with the current weights.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from areal.server.engine import KVBatch, ModelRunner
from areal.server.memory import ServerBusy, final_length, kv_footprint, released_message
from areal.server.sampling import SamplingParams, mask_stop_tokens, sample

logger = logging.getLogger("areal.server")


@dataclass
class Sequence:
    """One generation request as the scheduler tracks it."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    on_finish: Callable[["Sequence"], None]
    stop_ids: list[int] = field(default_factory=list)  # EOS + stop_token_ids (unless ignore_eos)
    created: float = field(default_factory=time.time)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: dict | None = None
    retractions: int = 0
    # (output index, weight version) from which on tokens come from that version; the HTTP
    # layer appends one when the version changes while the sequence is in flight
    version_spans: list[tuple[int, str]] = field(default_factory=list)
    # called on the worker thread after each token that does not end the sequence (a streamed
    # request's chunks; its end is on_finish)
    on_token: Callable[["Sequence"], None] | None = None


@dataclass
class _Command:
    fn: Callable[[], object]
    future: Future
    drain: bool


@dataclass
class BatchStats:
    """Counters shown by /get_server_info (they show whether requests really were batched)."""

    prefill_steps: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    requests_served: int = 0
    requests_aborted: int = 0
    max_batch_size: int = 0
    max_kv_tokens_reserved: int = 0  # the largest worst-case KV footprint admitted (memory.py)
    kv_budget_waits: int = 0  # admission rounds that left a request waiting for KV budget
    _batch_size_sum: int = 0
    prefill_s: float = 0.0  # wall seconds in prefill + merge (including the first token's sampling)
    decode_s: float = 0.0  # wall seconds in decode steps (forward, sampling, reading the tokens back)

    def record_decode(self, size: int, seconds: float = 0.0) -> None:
        self.decode_steps += 1
        self._batch_size_sum += size
        self.max_batch_size = max(self.max_batch_size, size)
        self.decode_s += seconds

    def as_dict(self) -> dict:
        mean = self._batch_size_sum / self.decode_steps if self.decode_steps else 0.0
        return {
            "forward_steps": self.prefill_steps + self.decode_steps,
            "prefill_steps": self.prefill_steps,
            "decode_steps": self.decode_steps,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "requests_served": self.requests_served,
            "requests_aborted": self.requests_aborted,
            "max_batch_size": self.max_batch_size,
            "mean_batch_size": round(mean, 3),
            "max_kv_tokens_reserved": self.max_kv_tokens_reserved,
            "kv_budget_waits": self.kv_budget_waits,
            "decode_rows": self._batch_size_sum,  # sequences stepped, over all decode steps
            "prefill_s": round(self.prefill_s, 3),
            "decode_s": round(self.decode_s, 3),
        }


class ThroughputLog:
    """One INFO line per `period` seconds while the server works (SGLang logs the same kind):
    decode steps with their mean time and batch size, prefills, generated tokens/s, the share of
    wall time spent in forward passes, and the queues. A step time that does not grow with the
    batch size means the host (Python, kernel launches) is the limit, not the GPU."""

    COUNTERS = (
        "decode_steps",
        "prefill_steps",
        "prefill_tokens",
        "generated_tokens",
        "prefill_s",
        "decode_s",
        "_batch_size_sum",
    )

    def __init__(self, stats: BatchStats, period: float = 10.0):
        self.stats, self.period = stats, period
        self._last = time.monotonic()
        self._seen = self._counters()

    def _counters(self) -> dict:
        return {k: getattr(self.stats, k) for k in self.COUNTERS}

    def maybe_log(self, running: int, waiting: int) -> None:
        now = time.monotonic()
        elapsed = now - self._last
        if elapsed < self.period:
            return
        cur = self._counters()
        d = {k: cur[k] - self._seen[k] for k in self.COUNTERS}
        self._last, self._seen = now, cur
        if not (d["decode_steps"] or d["prefill_steps"]):
            return
        steps = max(d["decode_steps"], 1)
        logger.info(
            "last %.0fs: %d decode steps (%.1f ms each, mean batch %.0f), %d prefills "
            "(%d tokens, %.2fs), %.0f gen tok/s, forward passes %.0f%% of the time; "
            "running %d, waiting %d",
            elapsed,
            d["decode_steps"],
            1e3 * d["decode_s"] / steps,
            d["_batch_size_sum"] / steps,
            d["prefill_steps"],
            d["prefill_tokens"],
            d["prefill_s"],
            d["generated_tokens"] / elapsed,
            100 * (d["decode_s"] + d["prefill_s"]) / elapsed,
            running,
            waiting,
        )


def abort_reason(message: str, status_code: int | None = None) -> dict:
    """SGLang's FINISH_ABORT json shape."""
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": None}


class Scheduler:
    """Owns the running batch; the public methods are safe to call from any thread."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_running: int,
        max_prefill_tokens: int,
        decode: Callable[[list[int]], str] | None = None,
        max_total_tokens: int | None = None,
    ):
        self.runner = runner
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.max_total_tokens = max_total_tokens  # KV budget in token slots; None: unbounded
        # tags given back by /release_memory_occupation (set on the worker thread, see memory.py)
        self.memory_released: frozenset[str] = frozenset()
        self.decode = decode
        self.stats = BatchStats()
        self._throughput = ThroughputLog(self.stats)
        self._inbox: queue.Queue = queue.Queue()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # row i of self._batch is self._running[i]
        self._pending: list[int] = []  # sampled token of each running row, not yet in the cache
        self._batch: KVBatch | None = None
        self._commands: deque[_Command] = deque()
        self._paused: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="areal-scheduler", daemon=True)

    # ---- any thread -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout=30)

    def submit(self, seq: Sequence) -> None:
        self._inbox.put(("submit", seq))

    def abort(self, rid: str | None, message: str = "Aborted by request.") -> Future:
        """Abort one request by rid, or all (rid None); resolves when done."""
        return self.call(lambda: self._abort(rid, message))

    def call(self, fn: Callable[[], object], drain: bool = False) -> Future:
        """Run `fn` on the worker thread between steps; see the module docstring for `drain`."""
        future: Future = Future()
        self._inbox.put(("command", _Command(fn, future, drain)))
        return future

    def pause(self, mode: str) -> Future:
        return self.call(lambda: self._pause(mode))

    def resume(self) -> Future:
        return self.call(self._resume)

    def load(self) -> dict:
        running = list(self._running)
        width = max((final_length(s) for s in running), default=0)
        return {
            "running": len(running),
            "waiting": len(self._waiting),
            "paused": self._paused,
            "kv_tokens_reserved": kv_footprint(len(running), width),
            "max_total_num_tokens": self.max_total_tokens,
        }

    def kv_cache_bytes(self) -> int:
        batch = self._batch
        return batch.nbytes() if batch is not None else 0

    # ---- worker thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._read_inbox(block=not self._has_work())
            self._run_commands()
            if self._paused:
                continue
            try:
                if self._may_admit():
                    self._admit()
                if self._running:
                    self._decode_step()
                self._throughput.maybe_log(len(self._running), len(self._waiting))
            except Exception as exc:  # keep serving: fail the batch, not the server
                logger.exception("forward pass failed")
                self._fail_running(f"Internal server error during generation: {exc}")

    def _has_work(self) -> bool:
        if self._commands and (self._paused or not self._commands[0].drain or not self._running):
            return True
        return not self._paused and bool(self._running or (self._waiting and self._may_admit()))

    def _read_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if item[0] == "submit" and self.memory_released:  # never queued: nothing to run on
                self._finish(item[1], abort_reason(released_message("/generate", self.memory_released), 400))
            elif item[0] == "submit":
                self._waiting.append(item[1])
            elif item[0] == "command":
                self._commands.append(item[1])
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_commands(self) -> None:
        while self._commands:
            cmd = self._commands[0]
            if cmd.drain and self._running and not self._paused:
                return  # wait for the running requests to finish
            self._commands.popleft()
            if not cmd.future.set_running_or_notify_cancel():
                continue
            try:
                cmd.future.set_result(cmd.fn())
            except BaseException as exc:
                cmd.future.set_exception(exc)

    def _may_admit(self) -> bool:
        draining = bool(self._commands) and self._commands[0].drain
        return not draining and not self.memory_released and len(self._running) < self.max_running

    def _fits_kv_budget(self, rows: int, width: int) -> bool:
        return self.max_total_tokens is None or kv_footprint(rows, width) <= self.max_total_tokens

    def _admit(self) -> None:
        """Prefill as many waiting sequences as the bounds allow and merge them in."""
        chosen: list[Sequence] = []
        width = 0
        kv_width = max((final_length(s) for s in self._running), default=0)
        while self._waiting and len(self._running) + len(chosen) < self.max_running:
            seq = self._waiting[0]
            if seq.params.max_new_tokens == 0:
                self._waiting.popleft()
                self._finish(seq, {"type": "length", "length": 0})
                continue
            new_kv_width = max(kv_width, final_length(seq))
            if not self._fits_kv_budget(len(self._running) + len(chosen) + 1, new_kv_width):
                if not self._running and not chosen:  # alone it can never fit: do not wait
                    self._waiting.popleft()
                    self._finish(seq, abort_reason(self._never_fits(seq), 400))
                    continue
                self.stats.kv_budget_waits += 1
                break  # wait for running sequences to finish and free their cache
            new_width = max(width, len(seq.input_ids) + len(seq.output_ids))
            if chosen and new_width * (len(chosen) + 1) > self.max_prefill_tokens:
                break
            chosen.append(self._waiting.popleft())
            width, kv_width = new_width, new_kv_width
        if not chosen:
            return
        reserved = kv_footprint(len(self._running) + len(chosen), kv_width)
        self.stats.max_kv_tokens_reserved = max(self.stats.max_kv_tokens_reserved, reserved)
        t0 = time.perf_counter()
        prompts = [s.input_ids + s.output_ids for s in chosen]
        batch, logits = self.runner.prefill(prompts)
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens += sum(len(p) for p in prompts)
        self._batch = KVBatch.merge(self._batch, batch)
        self._running.extend(chosen)
        self._pending.extend([-1] * len(chosen))
        self._sample_rows(logits, list(range(len(self._running) - len(chosen), len(self._running))))
        self.stats.prefill_s += time.perf_counter() - t0

    def _never_fits(self, seq: Sequence) -> str:
        return (
            f"/generate: the request needs {final_length(seq)} KV cache tokens (prompt + "
            f"max_new_tokens), more than the server's whole budget, max_total_num_tokens "
            f"{self.max_total_tokens}; lower max_new_tokens, or raise --mem-fraction-static "
            "(or --max-total-tokens)."
        )

    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        size = len(self._running)
        max_width = max(final_length(s) for s in self._running)  # caps the cache's spare columns
        logits = self.runner.decode(self._batch, self._pending, max_width)
        self._sample_rows(logits, list(range(len(self._running))))
        self.stats.record_decode(size, time.perf_counter() - t0)

    def _sample_rows(self, logits, rows: list[int]) -> None:
        """Sample the next token of running `rows` (logits row j belongs to rows[j])."""
        seqs = [self._running[r] for r in rows]
        below_min = [j for j, s in enumerate(seqs) if len(s.output_ids) < s.params.min_new_tokens]
        # clone(): an inference-mode tensor cannot be edited in place outside inference mode.
        logits = logits.float().clone() if below_min else logits.float()
        mask_stop_tokens(logits, below_min, [seqs[j].stop_ids for j in below_min])
        positions = [len(s.input_ids) + len(s.output_ids) for s in seqs]  # of the token sampled now
        tokens, logprobs = sample(logits, [s.params for s in seqs], self.runner.generator, positions)
        finished = []
        for row, seq, tok, lp in zip(rows, seqs, tokens.tolist(), logprobs.tolist()):
            self._pending[row] = tok
            reason = self._append(seq, tok, lp)
            if reason is not None:
                finished.append((row, reason))
        self._retire(finished)

    def _append(self, seq: Sequence, token: int, logprob: float) -> dict | None:
        """Record a token; returns the finish reason if the sequence is done (SGLang's order)."""
        seq.output_ids.append(token)
        if seq.return_logprob:
            seq.output_logprobs.append(logprob)
        self.stats.generated_tokens += 1
        reason = self._finish_reason(seq, token)
        if reason is None and seq.on_token is not None:  # the last token's news is on_finish
            try:
                seq.on_token(seq)
            except Exception:
                logger.exception("on_token callback of %s failed", seq.rid)
        return reason

    def _finish_reason(self, seq: Sequence, token: int) -> dict | None:
        """Whether the token just recorded ends the sequence, and why (SGLang's order)."""
        if len(seq.output_ids) >= seq.params.max_new_tokens:
            return {"type": "length", "length": seq.params.max_new_tokens}
        if token in seq.stop_ids:
            return {"type": "stop", "matched": token}
        if seq.params.stop and self.decode is not None:
            # Each token decodes to at least one character, so this tail covers any stop string.
            window = max(len(s) for s in seq.params.stop) + 1
            tail = self.decode(seq.output_ids[-window:])
            for stop in seq.params.stop:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
        return None

    def _retire(self, finished: list[tuple[int, dict]]) -> None:
        if not finished:
            return
        done_rows = {row for row, _ in finished}
        for row, reason in finished:
            self._finish(self._running[row], reason)
        self._keep_rows([r for r in range(len(self._running)) if r not in done_rows])

    def _keep_rows(self, keep: list[int]) -> None:
        self._running = [self._running[r] for r in keep]
        self._pending = [self._pending[r] for r in keep]
        self._batch = self._batch.select(keep) if self._batch is not None else None

    def _finish(self, seq: Sequence, reason: dict) -> None:
        seq.finish_reason = reason
        if reason["type"] == "abort":
            self.stats.requests_aborted += 1
        else:
            self.stats.requests_served += 1
        try:
            seq.on_finish(seq)
        except Exception:
            logger.exception("on_finish callback of %s failed", seq.rid)

    def _abort(self, rid: str | None, message: str) -> int:
        """Finish matching waiting and running sequences with reason abort (tokens so far)."""

        def hit(seq: Sequence) -> bool:
            return rid is None or seq.rid == rid

        count = 0
        for seq in [s for s in self._waiting if hit(s)]:
            self._waiting.remove(seq)
            self._finish(seq, abort_reason(message))
            count += 1
        rows = [r for r, s in enumerate(self._running) if hit(s)]
        self._retire([(r, abort_reason(message)) for r in rows])
        return count + len(rows)

    def _fail_running(self, message: str) -> None:
        rows = list(range(len(self._running)))
        self._retire([(r, abort_reason(message, 500)) for r in rows])
        self._batch = None

    def _pause(self, mode: str) -> int:
        """in_place / retract; returns the number of sequences held."""
        self._paused = mode
        held = len(self._running)
        if mode == "retract" and self._running:
            for seq in reversed(self._running):
                seq.retractions += 1
                self._waiting.appendleft(seq)
            self._running, self._pending, self._batch = [], [], None
        return held

    def _resume(self) -> None:
        self._paused = None

    def check_flushable(self, where: str) -> None:
        """Raise ServerBusy while any request waits or runs, held by a pause included (worker
        thread). SGLang's scheduler refuses a cache flush then, and asserts when a weight update
        asked for one, which takes the server down; here the caller gets the refusal as a 400."""
        if self._running or self._waiting:
            raise ServerBusy(
                f"{where}: cache not flushed because there are pending requests. #queue-req: "
                f"{len(self._waiting)}, #running-req: {len(self._running)}"
                + (f" (held by /pause_generation mode {self._paused})" if self._paused else "")
                + ". A weight update sent while requests are held must pass flush_cache=false (SGLang would "
                "assert and stop its scheduler); flush with /flush_cache once they are done."
            )

    def check_idle_for_release(self) -> None:
        """Raise ServerBusy unless the server is idle: no request running or queued, held by a
        pause included (worker thread). SGLang's release asserts is_fully_idle, which counts its
        waiting queue, where retract holds requests: the refusal here is its crash there."""
        queued = len(self._waiting)
        if self._running or queued:
            held = f" (held by /pause_generation mode {self._paused})" if self._paused else ""
            raise ServerBusy(
                f"/release_memory_occupation: {len(self._running)} request(s) are running and {queued} "
                f"queued{held}; SGLang releases only an idle server (it asserts otherwise). Pause with "
                "/pause_generation mode 'abort' (the client resubmits what it aborts) or let the requests "
                "finish, then release."
            )
