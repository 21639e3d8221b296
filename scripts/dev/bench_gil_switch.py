"""How long a thread issuing small torch ops waits for the GIL while another thread runs Python.

In an asynchronous run the rollout client thread (answers, rewards, padding) shares the trainer's
process. Each torch op releases the GIL, and Python hands it back to the op's thread only after
the other thread has held it for the switch interval, so the interval bounds the stall per op.
This measures that stall for several intervals (rollout.gil_switch_interval_ms sets the trainer's):

    python scripts/dev/bench_gil_switch.py --out /tmp/bench_gil_switch.json
    python scripts/dev/bench_gil_switch.py --intervals-ms 5 1 0.5 0.2 --ops 2000 --out ...

Reports per interval: microseconds per op with the op thread alone and beside a busy thread, and
how many Python work units the busy thread finished meanwhile (its own cost of short intervals).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--intervals-ms", type=float, nargs="+", default=[5.0, 1.0, 0.5, 0.2, 0.1])
    p.add_argument("--ops", type=int, default=2000, help="torch ops per measurement")
    p.add_argument("--repeats", type=int, default=3, help="measurements per interval (the median is kept)")
    return p.parse_args(argv)


def op_seconds(n_ops: int) -> float:
    """Wall time of `n_ops` small tensor adds (each releases and re-takes the GIL)."""
    import torch

    x = torch.ones(16)
    t0 = time.perf_counter()
    for _ in range(n_ops):
        x = x + 1
    return time.perf_counter() - t0


class BusyThread:
    """A thread running pure-Python work units (like parsing answers) until stopped."""

    def __init__(self):
        self.units = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            sum(i * i for i in range(1000))
            self.units += 1

    def __enter__(self):
        self._thread.start()
        time.sleep(0.05)  # let it take the GIL first
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(interval_ms: float, n_ops: int, repeats: int) -> dict:
    sys.setswitchinterval(interval_ms / 1000.0)
    alone = sorted(op_seconds(n_ops) for _ in range(repeats))[repeats // 2]
    contended, units_per_s = [], []
    for _ in range(repeats):
        with BusyThread() as busy:
            start_units, t0 = busy.units, time.perf_counter()
            contended.append(op_seconds(n_ops))
            units_per_s.append((busy.units - start_units) / (time.perf_counter() - t0))
    contended.sort()
    return {
        "interval_ms": interval_ms,
        "alone_us_per_op": alone / n_ops * 1e6,
        "contended_us_per_op": contended[repeats // 2] / n_ops * 1e6,
        "busy_thread_units_per_s": sorted(units_per_s)[repeats // 2],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    default = sys.getswitchinterval()
    rows = []
    try:
        for ms in args.intervals_ms:
            row = measure(ms, args.ops, args.repeats)
            rows.append(row)
            print(
                f"switch interval {ms:g} ms: {row['alone_us_per_op']:.1f} us/op alone, "
                f"{row['contended_us_per_op']:.1f} us/op beside a busy thread "
                f"(which ran {row['busy_thread_units_per_s']:.0f} units/s)",
                flush=True,
            )
    finally:
        sys.setswitchinterval(default)
    result = {
        "benchmark": "bench_gil_switch",
        "config": vars(args),
        "rows": rows,
        "hardware": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": platform.machine(),
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
