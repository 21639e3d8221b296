"""Many concurrent agent runs on CPU: the calculator agent (examples/calculator_agent.py) through
the OpenAI proxy, the rollout executor and a real built-in server with the tiny chat model.

Run (2,048 runs at once: 256 episodes x 8 samples, the agents in one worker process):

    .venv/bin/python scripts/bench_agents.py --out /tmp/bench_agents.json
    .venv/bin/python scripts/bench_agents.py --episodes 64 --workers 0 --out /tmp/agents_inproc.json

One batch of `--episodes` records goes through `rollout_batch` with max_concurrent_rollouts =
episodes, so every run starts at once and connects in one burst. Recorded (JSON, --out): runs
completed and whether every run's reward came back (one row per run, finite reward), seconds and
runs/s, the kernel's ListenOverflows before and after (areal.infra.sockets.listen_overflows; any
process's overflow counts, so run it on a quiet machine), the peak open descriptors of this process
(the trainer's side), of the agent worker(s) and of the server, and the CPU seconds this process
used during the batch (what the agents cost the trainer's GIL: with --workers 0 they run here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Where to write the JSON result.")
    p.add_argument("--episodes", type=int, default=256, help="Episodes in the batch, all running at once.")
    p.add_argument("--samples", type=int, default=8, help="gconfig.n_samples: agent runs per episode.")
    p.add_argument("--workers", type=int, default=1, help="workflow.agent.workers (0: in this process).")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-running-requests", type=int, default=256, help="The server's decode batch.")
    p.add_argument("--model-path", default="tiny:chat")
    return p.parse_args(argv)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class FdSampler:
    """Peak descriptors per process, sampled every 0.5 s from a thread (listing 6,000 descriptors
    costs CPU time that this process's figure would count)."""

    def __init__(self, pids: dict[str, list[int]]):
        self.pids, self.peak = pids, {name: 0 for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.5):
            for name, pids in self.pids.items():
                self.peak[name] = max(self.peak[name], sum(open_fds(p) for p in pids))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main(argv=None) -> dict:
    args = parse_args(argv)
    from areal.config.rollout import GenerationConfig
    from areal.dataset.word_problems import make_word_problems
    from areal.engine.sglang.client import RemoteSGLangEngine
    from areal.infra.server_process import start_builtin_server as start_server
    from areal.infra.sockets import listen_overflows, raise_open_file_limit
    from areal.models.resolve import resolve_model_path
    from areal.workflow.agent import AgentWorkflow

    runs = args.episodes * args.samples
    raise_open_file_limit(4 * runs if args.workers == 0 else 256, what="bench_agents.py")
    model = resolve_model_path(args.model_path)
    server = start_server(
        model,
        extra_args=["--dtype", "float32", "--max-running-requests", str(args.max_running_requests)],
        env={"OMP_NUM_THREADS": "1"},
    )
    engine = RemoteSGLangEngine.from_pretrained(
        model,
        server_addrs=[server.url],
        rollout={"consumer_batch_size": args.episodes, "max_concurrent_rollouts": args.episodes},
        **{"sglang.context_length": 2048},
    )
    wf = AgentWorkflow(
        "examples.calculator_agent:run",
        GenerationConfig(n_samples=args.samples, max_new_tokens=args.max_new_tokens),
        model,
        max_calls=3,
        context_length=2048,
        concurrency=runs,
        workers=args.workers,
    )
    records = make_word_problems(args.episodes, seed=0)
    result = {"episodes": args.episodes, "samples": args.samples, "runs": runs, "workers": args.workers}
    try:
        engine.rollout_batch(records[:1], wf)  # start the worker(s) and the proxy outside the burst
        pids = {"trainer": [os.getpid()], "server": [server.proc.pid]}
        if wf.pool is not None:
            pids["agent_workers"] = wf.pool.pids
        overflows = listen_overflows()
        cpu, t = time.process_time(), time.perf_counter()
        with FdSampler(pids) as fds:
            batch = engine.rollout_batch(records, wf)
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        rewards = batch["rewards"].tolist()
        result.update(
            completed_runs=len(rewards),
            every_reward_recorded=len(rewards) == runs and all(math.isfinite(r) for r in rewards),
            reward_mean=sum(rewards) / len(rewards),
            tool_call_rate=float(batch["stat/agent/tool_call_rate"].float().mean()),
            calls_per_run=float(batch["stat/agent/calls"].float().mean()),
            seconds=round(seconds, 2),
            runs_per_s=round(runs / seconds, 1),
            trainer_cpu_s=round(cpu, 2),
            listen_overflows_delta=None if overflows is None else listen_overflows() - overflows,
            peak_open_fds=fds.peak,
        )
    finally:
        wf.close()
        engine.destroy()
        server.stop()
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
