"""CPU cost of the rollout client in the trainer process, per generated sample.

In an asynchronous run the rollout client (RemoteSGLangEngine's executor thread: HTTP requests,
answers, rewards, tensors) shares the trainer's process, so its Python time competes with the
training thread for the GIL. This measures that time on its own: a built-in server in another
process serves a tiny model, and this process runs the GSM8K RLVR workflow for a few batches.

    python scripts/bench_rollout_client.py --out /tmp/bench_rollout_client.json
    python scripts/bench_rollout_client.py --batches 3 --batch-size 64 --n-samples 8 --out ...
    python scripts/bench_rollout_client.py --workers 1 --out ...   # the episodes in a worker process

Reports, per sample: the CPU seconds of this process while batches ran (the client's work, the
main thread only waits; with --workers, what the trainer keeps of it: admission, the workers'
messages, the batches), the wall time per batch, and the time spent in garbage collection by
generation (a stop-the-world pause for every thread of the process, the training thread included).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/gsm8k"))
    p.add_argument("--batches", type=int, default=3, help="measured batches (one more warms up)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per batch")
    p.add_argument("--n-samples", type=int, default=8)
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=4,
        help="kept small: the server runs on CPU here; the client's work per sample barely depends on it",
    )
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after the warm-up batch (what the trainer does after building its engines)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="run the episodes in this many worker processes (workflow.workers): this process's CPU is "
        "then what the trainer keeps (admission, messages, batches)",
    )
    return p.parse_args(argv)


class GcClock:
    """Seconds this process spent in garbage collection, by generation (gc.callbacks)."""

    def __init__(self):
        import gc

        self.seconds, self.count, self._t0 = [0.0, 0.0, 0.0], [0, 0, 0], None
        gc.callbacks.append(self._on)

    def _on(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds[info["generation"]] += time.perf_counter() - self._t0
            self.count[info["generation"]] += 1

    def snapshot(self):
        return list(self.seconds), list(self.count)


def workers_cpu_s(workflow) -> float:
    """CPU seconds the episode worker processes (not their reward pools) have used so far; 0
    without workers or before the first episode starts them."""
    import psutil

    pool = getattr(workflow, "pool", None)
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in (pool.pids if pool else []))


def main(argv=None) -> dict:
    import functools
    import tempfile

    from areal.api.weights import WeightUpdateMeta
    from areal.dataset import load_gsm8k
    from areal.engine.sglang.client import RemoteSGLangEngine
    from areal.infra.server_process import start_builtin_server as start_server
    from areal.models.tiny import make_tiny_model_dir
    from areal.utils.gil import shorten_gil_switch_interval
    from areal.workflow.in_workers import WorkflowInWorkers
    from areal.workflow.rlvr import RLVRWorkflow

    args = parse_args(argv)
    model_dir = str(make_tiny_model_dir(Path(tempfile.gettempdir()) / "bench-rollout-client-model", max_position=2048))
    records = load_gsm8k(args.data, "train")
    need = (args.batches + 2) * args.batch_size  # the executor queues one batch ahead
    loader = [records[i : i + args.batch_size] for i in range(0, need, args.batch_size)]
    server = start_server(
        model_dir,
        extra_args=[
            "--dtype",
            "float32",
            "--max-running-requests",
            str(args.batch_size * args.n_samples),
            "--log-level",
            "warning",
        ],
        env={"OMP_NUM_THREADS": "1"},
    )
    engine = RemoteSGLangEngine.from_pretrained(
        model_dir,
        server_addrs=[server.url],
        max_concurrent_rollouts=args.batch_size,
        rollout={"consumer_batch_size": args.batch_size, "max_head_offpolicyness": 0},
        gconfig={
            "n_samples": args.n_samples,
            "max_new_tokens": args.max_new_tokens,
            "min_new_tokens": 0,
            "ignore_eos": True,
            "temperature": 1.0,
        },
    )
    shorten_gil_switch_interval(engine.config.rollout.gil_switch_interval_ms)  # as a trainer's rank 0 does
    recipe = functools.partial(RLVRWorkflow, "gsm8k", engine.config.gconfig, model_dir)
    workflow = WorkflowInWorkers(recipe, args.workers, inner_name="RLVRWorkflow") if args.workers else recipe()
    rows = []
    gc_clock = GcClock()
    try:
        for b in range(args.batches + 1):  # batch 0 warms up
            # a synchronous trainer: a new version before each batch (offpolicyness 0 holds the
            # next batch's episodes until then)
            engine.control.update_weights(WeightUpdateMeta("disk", path=model_dir, version=b))
            (gc_s0, gc_n0), cpu0, wall0 = gc_clock.snapshot(), time.process_time(), time.perf_counter()
            workers0 = workers_cpu_s(workflow)
            batch = engine.prepare_batch(loader, workflow)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            in_workers = workers_cpu_s(workflow) - workers0
            gc_s, gc_n = gc_clock.snapshot()
            if b == 0:
                if args.gc_freeze:
                    import gc

                    gc.collect()
                    gc.freeze()
                continue
            n = int(batch["rewards"].numel())
            rows.append(
                {
                    "samples": n,
                    "wall_s": round(wall, 3),
                    "client_cpu_s": round(cpu, 3),
                    "client_cpu_ms_per_sample": round(1e3 * cpu / n, 3),
                    # the episodes' own Python, off the trainer's GIL (0 without --workers)
                    "workers_cpu_ms_per_sample": round(1e3 * in_workers / n, 3),
                    # stop-the-world pauses: they stall a training thread in the same process too
                    "gc_s_by_generation": [round(a - b, 4) for a, b in zip(gc_s, gc_s0)],
                    "gc_collections_by_generation": [a - b for a, b in zip(gc_n, gc_n0)],
                }
            )
            print(rows[-1], flush=True)
    finally:
        engine.destroy()
        workflow.close()
        server.stop()
    per_sample = sorted(r["client_cpu_ms_per_sample"] for r in rows)[len(rows) // 2]
    out = {
        "batch_size": args.batch_size,
        "n_samples": args.n_samples,
        "max_new_tokens": args.max_new_tokens,
        "workers": args.workers,
        "rows": rows,
        "median_client_cpu_ms_per_sample": per_sample,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"client CPU per sample: {per_sample} ms (median of {len(rows)} batches)")
    return out


if __name__ == "__main__":
    main()
