"""Where a decode step of the built-in server goes: wall time per step against the time the host
takes to issue it, per batch size, and a kernel table (torch.profiler) at the largest batch.

In-process (ModelRunner, no HTTP), on a random-weight real shape, greedy tokens, so it isolates
the model side of `bench_server.py`.

    python scripts/dev/profile_decode.py --shape qwen2.5-0.5b --batch 1 64 256 512 --out decode.json \
        --table decode_profile.txt
    python scripts/dev/profile_decode.py --shape tiny --device cpu --batch 1 8 --steps 4 --out /tmp/d.json

Per batch size: `step_ms` (wall, synchronised every step as the scheduler does when it reads the
tokens back) and `issue_ms` (until the forward pass returns on the host, before the GPU has
finished). issue_ms close to step_ms means the step is host-bound (Python and kernel launches);
well below means the GPU is the limit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(runner, batch_size: int, prompt_len: int, steps: int, vocab: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(batch_size)
    prompts = torch.randint(3, vocab, (batch_size, prompt_len), generator=g).tolist()
    batch, logits = runner.prefill(prompts)
    tokens = logits.argmax(-1).tolist()
    step_s, issue_s = [], []
    for _ in range(steps):
        _sync(runner.device)
        t0 = time.perf_counter()
        logits = runner.decode(batch, tokens)
        t1 = time.perf_counter()
        tokens = logits.argmax(-1).tolist()  # the host reads the tokens back: a sync per step
        step_s.append(time.perf_counter() - t0)
        issue_s.append(t1 - t0)
    step = statistics.median(step_s[1:] or step_s) * 1e3
    issue = statistics.median(issue_s[1:] or issue_s) * 1e3
    return {
        "batch": batch_size,
        "cache_len_end": int(batch.mask.shape[1]),
        "step_ms": round(step, 2),
        "issue_ms": round(issue, 2),
        "tokens_per_s": round(batch_size / step * 1e3, 1),
    }, (batch, tokens)


def profile_table(runner, state, steps: int, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    batch, tokens = state
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            tokens = runner.decode(batch, tokens).argmax(-1).tolist()
    key = "self_cuda_time_total" if runner.device.type == "cuda" else "self_cpu_time_total"
    Path(path).write_text(prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70))


def model_shapes():
    """scripts/model_shapes.py: this tool runs from scripts/dev, whose parent is not on sys.path."""
    path = Path(__file__).resolve().parents[1] / "model_shapes.py"
    spec = importlib.util.spec_from_file_location("model_shapes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> dict:
    from areal.server.engine import ModelRunner

    build_model_dir = model_shapes().build_model_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256, 512])
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument(
        "--attn",
        nargs="+",
        default=[None],
        help="attention implementations to compare (e.g. sdpa areal_server_sdpa); default: the server's",
    )
    p.add_argument("--table", default=None, help="write a kernel table of 8 steps at the largest batch here")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    model_dir, _ = build_model_dir(args.shape, Path(tempfile.gettempdir()) / "areal-bench-train")
    dtype = args.dtype or ("bfloat16" if args.device != "cpu" else "float32")
    runner = ModelRunner(model_dir, dtype=dtype, device=args.device)
    if runner.device.type == "cpu" and args.dtype is None:
        runner = ModelRunner(model_dir, dtype="float32", device="cpu")
    measure(runner, 2, 8, 3, runner.vocab_size)  # warm-up
    rows, state = [], None
    for attn in args.attn:
        if attn:
            runner.model.set_attn_implementation(attn)
        for b in args.batch:
            row, state = measure(runner, b, args.prompt_len, args.steps, runner.vocab_size)
            row["attn"] = runner.model.config._attn_implementation
            rows.append(row)
            print(row, flush=True)
        if args.table:
            profile_table(runner, state, 8, args.table.replace(".txt", "") + f"_{row['attn']}.txt")
    out = {
        "shape": args.shape,
        "device": str(runner.device),
        "dtype": str(runner.dtype),
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
