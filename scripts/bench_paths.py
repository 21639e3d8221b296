"""The rollout paths at 8 times their recipes' concurrency, on CPU: what holds and where it stops.

Three benchmarks, each through the project's own code and a real built-in server process
(tiny:arith) where it generates:

    rlvr        RLVRWorkflow under RolloutExecutor (engine.rollout_batch): --episodes prompts x
                --n-samples answers, all in flight at once (256 x 8 = 2,048 requests by default,
                8 x the GSM8K recipe's 256 per server), each scored by the reward pool.
    reward      --scores reward calls pending at once on one RewardRunner (default 2,048, the
                gsm8k reward, workflow.reward_workers=2 workers): every value checked.
    multi_turn  MultiTurnWorkflow (answer, feedback, retry; workflow.max_turns=2) at the same shape
                as rlvr: no recipe uses it, so it gets the RLVR recipe's 8 x.

Run (about a minute in all on 2 cores; docs/reliability.md, "Concurrency limits", has the figures):

    .venv/bin/python scripts/bench_paths.py --out /tmp/bench_paths.json                   # all three
    bash -c 'ulimit -n 1024; .venv/bin/python scripts/bench_paths.py --paths rlvr \
        --server-args "--max-queued-requests 512" --out /tmp/bench_paths_1024.json'       # a low hard limit
    .venv/bin/python scripts/bench_paths.py --paths rlvr multi_turn --max-new-tokens 64 --ignore-eos \
        --out /tmp/bench_paths_64.json                                                    # a longer burst
    .venv/bin/python scripts/bench_paths.py --paths rlvr --server-open-files 1400 --out /tmp/bench_paths_s1400.json

RemoteSGLangEngine.initialize() raises this process's soft open-file limit to the hard one, as it
does for every client, so a low limit is measured with `ulimit -n` (soft and hard);
--raise-open-files also checks up front, as trainer rank 0 and the rollout driver do, that the hard
limit holds a socket per request in flight. The server raises its own at start;
--server-open-files lowers it afterwards, as on a host whose hard limit is low.

Figures per path in the JSON (--out): episodes finished of those submitted, samples whose
reward came back, seconds, the peak of requests in flight from the client and of requests inside
the server (/get_server_info load.accepted), the peak open descriptors of this process and of the
server (/proc/PID/fd, sampled every 20 ms), the kernel's TcpExt ListenOverflows before and after
(areal.infra.sockets.listen_overflows; machine-wide, so other jobs can move it), errors by kind
with one example each, every HTTP status and failed attempt the client's session saw (the ones a
retry hid included), and the server log's warnings. An episode that fails is counted by its
error's kind and the others go on, so one run shows every kind of failure at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shlex
import threading
import time
from collections import Counter
from pathlib import Path

PATHS = ("rlvr", "reward", "multi_turn")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Where to write the JSON result.")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS), help="Which benchmarks to run.")
    p.add_argument("--model-path", default="tiny:arith")
    p.add_argument("--episodes", type=int, default=256, help="Prompts (episodes) in flight at once.")
    p.add_argument("--n-samples", type=int, default=8, help="gconfig.n_samples: requests per episode.")
    p.add_argument(
        "--max-concurrent-rollouts",
        type=int,
        default=None,
        help="rollout.max_concurrent_rollouts (default: --episodes, so all start at once).",
    )
    p.add_argument("--max-new-tokens", type=int, default=3, help="gconfig.max_new_tokens (the recipe's 3).")
    p.add_argument("--ignore-eos", action="store_true", help="gconfig.ignore_eos: every answer --max-new-tokens long.")
    p.add_argument("--max-turns", type=int, default=2, help="workflow.max_turns of multi_turn.")
    p.add_argument("--reward-fn", default="gsm8k", help="workflow.reward_fn.")
    p.add_argument("--reward-workers", type=int, default=2, help="workflow.reward_workers.")
    p.add_argument("--reward-timeout", type=float, default=15.0, help="workflow.reward_timeout_s.")
    p.add_argument("--scores", type=int, default=2048, help="reward: calls pending at once.")
    p.add_argument("--server-args", default="", help="Extra flags of the built-in server, one string.")
    p.add_argument(
        "--server-open-files",
        type=int,
        default=None,
        help="Lower the server's open-file limit (soft and hard) to this once it is up: a host with a low hard limit.",
    )
    p.add_argument(
        "--raise-open-files",
        action="store_true",
        help="Check first that the hard open-file limit holds a socket per request in flight, as trainer "
        "rank 0 and the rollout driver do (see docs/reliability.md).",
    )
    p.add_argument("--request-retries", type=int, default=None, help="rollout.request_retries (default: the config's).")
    return p.parse_args(argv)


# ---- measuring ------------------------------------------------------------------------------


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Peaks:
    """Peaks of named readings, sampled on a thread every `every_s` (None readings are skipped)."""

    def __init__(self, readings: dict, every_s: float = 0.02):
        self.readings, self.every_s = readings, every_s
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-peaks", daemon=True)

    def sample(self) -> None:
        for name, read in self.readings.items():
            try:
                value = read()
            except Exception:  # a reading that fails (server busy, process gone) is skipped
                value = None
            if value is not None:
                self.peak[name] = max(self.peak.get(name, value), value)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


class ServerLoad:
    """/get_server_info's load.accepted, polled on its own thread over one kept-alive connection
    (a reading that waits on a busy server must not hold up the descriptor sampler)."""

    def __init__(self, url: str, every_s: float = 0.1):
        import requests

        self.url, self.every_s = url, every_s
        self.session = requests.Session()
        self.peak_accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-server-load", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                load = self.session.get(self.url + "/get_server_info", timeout=30).json()["load"]
            except Exception:
                continue
            self.peak_accepted = max(self.peak_accepted, int(load.get("accepted") or 0))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.session.close()


def error_kind(exc: BaseException) -> str:
    """A failure's kind: its type and message with numbers, addresses and ids blanked."""
    text = f"{type(exc).__name__}: {exc}"
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text[:240]


class Recorder:
    """Wraps a workflow: counts requests in flight through it, and turns a failed episode into a
    counted error (the episode is dropped) so every other episode still runs."""

    def __init__(self, workflow):
        self.workflow = workflow
        self.inflight = 0
        self.peak_inflight = 0
        self.errors: Counter = Counter()
        self.examples: dict[str, str] = {}
        self.finished = 0

    def as_workflow(self):
        from areal.api.workflow import RolloutWorkflow

        recorder = self

        class Recorded(RolloutWorkflow):
            async def arun_episode(self, engine, data):
                try:
                    out = await recorder.workflow.arun_episode(_Counting(engine, recorder), data)
                except Exception as e:
                    kind = error_kind(e)
                    recorder.errors[kind] += 1
                    recorder.examples.setdefault(kind, str(e)[:2000])
                    return None
                recorder.finished += 1
                return out

        return Recorded()


class _Counting:
    """The engine, with its generations counted while they are in flight."""

    def __init__(self, engine, recorder: Recorder):
        self._engine, self._recorder = engine, recorder

    async def agenerate(self, req):
        r = self._recorder
        r.inflight += 1
        r.peak_inflight = max(r.peak_inflight, r.inflight)
        try:
            return await self._engine.agenerate(req)
        finally:
            r.inflight -= 1

    def __getattr__(self, name):
        return getattr(self._engine, name)


class HttpTrace:
    """What the client's HTTP session saw, retries included: answers by status and failed attempts
    by kind (a retry in the client hides them from the episode; they are counted here)."""

    def __init__(self):
        self.statuses: Counter = Counter()
        self.failures: Counter = Counter()
        self.examples: dict[str, str] = {}

    def config(self):
        import aiohttp

        tc = aiohttp.TraceConfig()

        async def on_end(session, ctx, params):
            self.statuses[str(params.response.status)] += 1

        async def on_exception(session, ctx, params):
            kind = error_kind(params.exception)
            self.failures[kind] += 1
            self.examples.setdefault(kind, str(params.exception)[:500])

        tc.on_request_end.append(on_end)
        tc.on_request_exception.append(on_exception)
        return tc


def traced_executor(engine, trace: HttpTrace):
    """engine.executor as RemoteSGLangEngine builds it, its shared HTTP session traced."""
    import functools

    from areal.rollout.executor import RolloutExecutor

    executor = RolloutExecutor(
        engine,
        engine.config.rollout,
        loop_scope=functools.partial(engine.session_scope, trace_configs=[trace.config()]),
    )
    engine.control.add_listener(executor)  # as engine.executor does: no episode starts while paused
    engine._executor = executor
    return executor


def warnings_in(log: str, limit: int = 10) -> dict:
    lines = [line for line in log.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b", line)]
    return {"count": len(lines), "first": lines[:limit]}


def fd_limit() -> list[int]:
    return list(resource.getrlimit(resource.RLIMIT_NOFILE))


# ---- the paths ------------------------------------------------------------------------------


def records(n: int) -> list[dict]:
    """n single-digit sums in GSM8K's record format (the CPU recipe's data)."""
    from areal.dataset.synthetic import load_synthetic_arith

    data = load_synthetic_arith("train", size=max(n, 1), seed=0)
    return data[:n]


def bench_generation(args, which: str) -> dict:
    """rlvr or multi_turn: one burst of --episodes episodes through the executor and a server."""
    from areal.engine.sglang.client import RemoteSGLangEngine
    from areal.infra.server_process import start_builtin_server as start_server
    from areal.infra.sockets import listen_overflows
    from areal.models.resolve import resolve_model_path

    model_dir = resolve_model_path(args.model_path)
    server = start_server(
        model_dir,
        timeout=300,
        extra_args=["--dtype", "float32", "--log-level", "warning", *shlex.split(args.server_args)],
        env={"OMP_NUM_THREADS": "1"},
    )
    concurrent = args.max_concurrent_rollouts or args.episodes
    overrides = {}
    if args.request_retries is not None:
        overrides["rollout.request_retries"] = args.request_retries
    engine = workflow = None
    try:
        if args.server_open_files:
            limit = (args.server_open_files, args.server_open_files)
            resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, limit)
        engine = RemoteSGLangEngine.from_pretrained(
            model_dir,
            server_addrs=[server.url],
            max_concurrent_rollouts=concurrent,
            rollout={"consumer_batch_size": args.episodes, "max_head_offpolicyness": 0},
            gconfig={
                "n_samples": args.n_samples,
                "max_new_tokens": args.max_new_tokens,
                "temperature": 1.0,
                "ignore_eos": args.ignore_eos,
            },
            **overrides,
        )
        wf_kwargs = {"reward_timeout_s": args.reward_timeout, "reward_workers": args.reward_workers}
        if which == "rlvr":
            from areal.workflow.rlvr import RLVRWorkflow

            workflow = RLVRWorkflow(args.reward_fn, engine.config.gconfig, model_dir, **wf_kwargs)
        else:
            from areal.workflow.multi_turn import MultiTurnWorkflow

            workflow = MultiTurnWorkflow(
                args.reward_fn, engine.config.gconfig, model_dir, max_turns=args.max_turns, **wf_kwargs
            )
        recorder = Recorder(workflow)
        data = records(args.episodes)
        trace = HttpTrace()
        traced_executor(engine, trace)  # started before the clock
        overflows0 = listen_overflows()
        me, server_pid = os.getpid(), server.proc.pid
        peaks = Peaks({"client_fds": lambda: open_fds(me), "server_fds": lambda: open_fds(server_pid)})
        t0 = time.monotonic()
        with peaks, ServerLoad(server.url) as load:
            batch = engine.rollout_batch(data, recorder.as_workflow())
        seconds = time.monotonic() - t0
        overflows1 = listen_overflows()
        rewards = batch.get("rewards")
        n_rewards = 0 if rewards is None else int(rewards.numel())
        finite = rewards is not None and bool(rewards.isfinite().all())
        import requests

        health = requests.get(server.url + "/health", timeout=30).status_code
        accepted_after = requests.get(server.url + "/get_server_info", timeout=30).json()["load"]["accepted"]
        result = {
            "episodes": args.episodes,
            "n_samples": args.n_samples,
            "max_concurrent_rollouts": concurrent,
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": args.ignore_eos,
            "requests_per_burst": args.episodes * args.n_samples,
            "episodes_finished": recorder.finished,
            "samples_with_reward": n_rewards if finite else 0,
            "mean_reward": None if not n_rewards else round(float(rewards.mean()), 4),
            "seconds": round(seconds, 2),
            "peak_requests_in_flight_client": recorder.peak_inflight,
            "peak_requests_in_server": load.peak_accepted,
            "peak_fds_client": peaks.peak.get("client_fds"),
            "peak_fds_server": peaks.peak.get("server_fds"),
            "listen_overflows_before": overflows0,
            "listen_overflows_after": overflows1,
            "errors": dict(recorder.errors),
            "error_examples": recorder.examples,
            "http_statuses_seen": dict(trace.statuses),  # every attempt, retried ones included
            "http_failures_seen": dict(trace.failures),
            "http_failure_examples": trace.examples,
            "reward_timeouts": getattr(workflow.reward, "n_timeouts", None),
            "server_health_after": health,
            "server_accepted_after": accepted_after,  # 0: no request slot leaked
            "server_args": args.server_args,
            "server_log": warnings_in(server.log()),
        }
        if which == "multi_turn":
            result["max_turns"] = args.max_turns
        return result
    finally:
        if workflow is not None:
            workflow.close()
        if engine is not None:
            engine.destroy()
        server.stop()


def bench_reward(args) -> dict:
    """--scores calls pending at once on one RewardRunner; each value checked against the
    reward called in this process."""
    from areal.reward.registry import resolve_reward_fn
    from areal.reward.runner import RewardRunner

    fn = resolve_reward_fn(args.reward_fn)
    calls = []
    for i, rec in enumerate(records(args.scores)):
        right = rec["solution"]
        completion = f"{rec['question']}{right}" if i % 2 == 0 else f"{rec['question']}{int(right) + 1}"
        fields = {k: v for k, v in rec.items() if k not in ("prompt", "completion", "prompt_ids", "completion_ids")}
        calls.append(
            ((rec["question"], completion, [], []), fields, float(fn(rec["question"], completion, [], [], **fields)))
        )
    runner = RewardRunner(args.reward_fn, timeout_s=args.reward_timeout, max_workers=args.reward_workers)
    errors: Counter = Counter()
    examples: dict[str, str] = {}
    me = os.getpid()

    async def score_all():
        async def one(a, kw):
            try:
                return await runner(*a, **kw)
            except Exception as e:
                kind = error_kind(e)
                errors[kind] += 1
                examples.setdefault(kind, str(e)[:2000])
                return None

        return await asyncio.gather(*(one(a, kw) for a, kw, _ in calls))

    try:
        peaks = Peaks({"client_fds": lambda: open_fds(me)})
        t0 = time.monotonic()
        with peaks:
            values = asyncio.run(score_all())
        seconds = time.monotonic() - t0
    finally:
        runner.close()
    returned = sum(v is not None for v in values)
    correct = sum(v is not None and v == want for v, (_, _, want) in zip(values, calls))
    return {
        "scores": args.scores,
        "reward_fn": args.reward_fn,
        "reward_workers": args.reward_workers,
        "reward_timeout_s": args.reward_timeout,
        "returned": returned,
        "correct": correct,
        "timeouts": runner.n_timeouts,
        "seconds": round(seconds, 2),
        "peak_fds_client": peaks.peak.get("client_fds"),
        "errors": dict(errors),
        "error_examples": examples,
    }


def run(args) -> dict:
    out = {"fd_limit_soft_hard_at_start": fd_limit(), "cpus": os.cpu_count()}
    if args.raise_open_files:
        from areal.infra.sockets import open_files_needed, raise_open_file_limit

        # as trainer rank 0 and the rollout driver do for their rollout client
        in_flight = (args.max_concurrent_rollouts or args.episodes) * args.n_samples
        raise_open_file_limit(
            open_files_needed(in_flight), what="bench_paths", keys="--max-concurrent-rollouts x --n-samples"
        )
    out["fd_limit_soft_hard"] = fd_limit()
    for path in args.paths:
        t0 = time.monotonic()
        out[path] = bench_reward(args) if path == "reward" else bench_generation(args, path)
        summary = {k: v for k, v in out[path].items() if not k.endswith("examples") and k != "server_log"}
        print(f"{path} ({time.monotonic() - t0:.0f} s): {json.dumps(summary)}", flush=True)
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
