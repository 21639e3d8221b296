"""Trainer throughput: tokens/s and MFU of FSDPEngine (packed micro-batches) against a bare FSDP2
loop (padded micro-batches, same model, same precision, same batch).

The model is a random-weight Qwen2.5 shape built from its public config (no download;
scripts/model_shapes.py), so the numbers measure the training step itself. Lengths vary (uniform in
[min_len, max_len]) as rollouts do, which is where packing pays: the bare loop computes on padding,
the engine does not.

    # GPU (one process per GPU; dp = number of processes)
    torchrun --nproc-per-node 1 scripts/bench_train.py --shape qwen2.5-0.5b --out bench_0.5b.json
    torchrun --nproc-per-node 1 scripts/bench_train.py --shape qwen2.5-1.5b --out bench_1.5b.json
    # other layouts of 2 processes (--backend: actor.backend; default fsdp:dN for N processes)
    torchrun --nproc-per-node 2 scripts/bench_train.py --backend fsdp:d2r2 ...   # HSDP 2 replicas x 1 shard
    torchrun --nproc-per-node 2 scripts/bench_train.py --backend fsdp:d1t2 ...   # tensor parallel 2
    # CPU smoke run (tiny model, a few seconds)
    python scripts/bench_train.py --shape tiny --device cpu --steps 2 --warmup 1 --seqs 8 \
        --min-len 8 --max-len 32 --max-tokens-per-mb 64 --out /tmp/bench_train.json

MFU = achieved model FLOP/s / peak bf16 dense FLOP/s of one device (--peak-tflops: 790 for an
H200, the rate an 8192^3 bf16 torch.matmul reaches there, below the 989 datasheet figure).
Training FLOPs per token = 6 x (matmul parameters, lm_head included) +
6 x layers x hidden x (average sequence length) for causal attention (forward + backward).
tokens/s counts the real tokens of the whole (global) batch; per device and MFU divide by the
number of processes, whatever the layout (tensor-parallel peers train the same rows and share the
FLOPs). The bare loop is always plain FSDP2 over all processes (fsdp:dN), whatever --backend says.
Writes one JSON object: per-run tokens/s (real tokens only), step seconds, MFU, peak memory.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from model_shapes import (
    PEAK_TFLOPS_H200,
    SHAPES,
    build_model_dir,
    flops_per_token,
    make_batch,
    make_grpo_batch,
    matmul_params,
)


def nll(logprobs, entropy, mb):
    mask = mb["loss_mask"].bool()
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1), {}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(step, n_warmup: int, n_steps: int, device: str) -> list[float]:
    times = []
    for k in range(n_warmup + n_steps):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        if k >= n_warmup:
            times.append(time.perf_counter() - t0)
    return times


# the engine runs beside the default one: result key -> (the flag that asks for it, its actor settings)
ENGINE_VARIANTS = {
    "engine_compiled": ("compile", {"compile": True}),
    "engine_fused": ("fused_logprobs", {"fused_logprobs": True}),
    "engine_compiled_logprobs": ("compile_logprobs", {"compile_logprobs": True}),
    "engine_fused_compiled_logprobs": ("fused_compiled_logprobs", {"fused_logprobs": True, "compile_logprobs": True}),
    "engine_every_token": ("every_token", {"logprobs_on_every_token": True}),
    "engine_shared_prompts": ("shared_prompts", {"share_prompts": True}),
    "engine_unshared_prompts": ("unshared_prompts", {"share_prompts": False}),
}


def bench_engine(
    args,
    model_dir: str,
    tok_dir: str,
    batch: dict,
    *,
    profile: str | None = None,
    **options,
) -> dict:
    """Time the engine's training step; `options` are actor settings (compile, fused_logprobs, ...)."""
    from areal.engine.fsdp.engine import FSDPEngine

    t0 = time.perf_counter()
    engine = FSDPEngine.from_pretrained(
        model_dir,
        tokenizer_path=tok_dir,
        dtype=args.dtype,
        learning_rate=1e-5,
        backend=args.backend,
        max_tokens_per_mb=args.max_tokens_per_mb,
        gradient_checkpointing=args.gradient_checkpointing,
        device=args.device,
        **options,
    )
    local = engine.dp_shard(batch)  # this data-parallel rank's rows; tensor-parallel peers get the same
    stats = {}

    def step():
        stats.update(engine.train_batch(local, nll, lambda mb: float(mb["loss_mask"].sum())))

    times = _timed(step, args.warmup, args.steps, args.device)
    if profile:
        _profile(step, profile, args.device)
    # warm-up steps included (they hold the compilation under --compile)
    out = {
        "step_s": times,
        "n_microbatches": stats.get("n_microbatches"),
        "loss": stats.get("loss"),
        # the tokens the last step's passes computed (rank 0's, times the data-parallel ranks): fewer
        # than the batch holds with shared prompts
        "computed_tokens": stats["n_tokens"] * engine.dp_size if stats.get("n_tokens") else None,
        "build_and_run_s": time.perf_counter() - t0,
    }
    engine.destroy()
    return out


def _profile(step, path: str, device: str) -> None:
    """One more step under torch.profiler: the top kernels by device time, as a text table."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    Path(path).write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70))


def bench_bare(args, model_dir: str, batch: dict) -> dict:
    """A plain FSDP2 loop: padded rows, micro-batches of as many rows as fit the same token budget."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    mesh = init_device_mesh(args.device, (dist.get_world_size(),))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, args.dtype), reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    n, width = batch["input_ids"].shape
    per_rank = n // dist.get_world_size()
    lo = dist.get_rank() * per_rank
    rows = max(1, args.max_tokens_per_mb // width)
    chunks = [slice(s, min(s + rows, lo + per_rank)) for s in range(lo, lo + per_rank, rows)]
    total = float(batch["loss_mask"][lo : lo + per_rank].sum())

    def step():
        for c in chunks:
            ids = batch["input_ids"][c].to(device)
            attn = batch["attention_mask"][c].to(device)
            mask = batch["loss_mask"][c].to(device)[:, 1:].bool()
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
            lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
            (-(lp * mask).sum() / total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = _timed(step, args.warmup, args.steps, args.device)
    return {"step_s": times, "n_microbatches": len(chunks)}


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def summarise(run: dict, real_tokens: int, padded_tokens: int, cfg, avg_len: float, args, world: int) -> dict:
    step = statistics.median(run["step_s"])
    tokens_s = real_tokens / step
    flops = flops_per_token(cfg, avg_len) * tokens_s / world
    out = dict(
        run,
        median_step_s=step,
        tokens_per_s=tokens_s,
        tokens_per_s_per_device=tokens_s / world,
        model_tflops_per_device=flops / 1e12,
        real_tokens=real_tokens,
        padded_tokens=padded_tokens,
    )
    if args.device == "cuda":
        out["mfu"] = flops / (args.peak_tflops * 1e12)
        # MFU of the work done: with shared prompts "mfu" counts prompt copies never computed
        if run.get("computed_tokens"):
            out["mfu_computed"] = out["mfu"] * run["computed_tokens"] / real_tokens
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    return out


def _actor_settings(parser, pairs: list[str]) -> dict:
    """--actor KEY=VALUE settings as engine keyword arguments, each value read as YAML (true, 8192)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            parser.error(f"--actor {pair!r}: expected KEY=VALUE, e.g. fused_logprobs=true")
        out[key] = yaml.safe_load(value)
    return out


def main(argv=None) -> None:
    import torch.distributed as dist
    from transformers import AutoConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seqs", type=int, default=64, help="sequences per step (global)")
    p.add_argument("--min-len", type=int, default=256)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--max-tokens-per-mb", type=int, default=16384)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=PEAK_TFLOPS_H200,
        help="bf16 dense peak of one device (H200: 790 measured with torch.matmul, 989 datasheet)",
    )
    p.add_argument(
        "--backend",
        default=None,
        help="actor.backend of the engine: fsdp:d2 (FSDP), fsdp:d2r2 (HSDP 2 replicas x 1 shard), "
        "fsdp:d1t2 (tensor parallel 2); its world size must equal the process count "
        "(default: fsdp:dN for N processes)",
    )
    p.add_argument("--skip-bare", action="store_true")
    p.add_argument(
        "--compile",
        action="store_true",
        help="also run the engine with actor.compile (torch.compile per decoder layer): engine_compiled",
    )
    p.add_argument(
        "--fused-logprobs",
        action="store_true",
        help="also run the engine with actor.fused_logprobs (no [tokens, vocab] logits kept): engine_fused",
    )
    p.add_argument(
        "--compile-logprobs",
        action="store_true",
        help="also run the engine with actor.compile_logprobs (fused logprob kernels): engine_compiled_logprobs",
    )
    p.add_argument(
        "--fused-compiled-logprobs",
        action="store_true",
        help="also run the engine with both actor.fused_logprobs and actor.compile_logprobs",
    )
    p.add_argument(
        "--every-token",
        action="store_true",
        help="also run the engine with actor.logprobs_on_every_token (the lm_head on prompt rows too, and "
        "so no shared prompts): engine_every_token (matters with --grpo, whose loss is on the answers only)",
    )
    p.add_argument(
        "--shared-prompts",
        action="store_true",
        help="also run the engine with actor.share_prompts=true (each prompt computed once for the answers "
        "that share it; the default, auto, does so on CUDA only): engine_shared_prompts",
    )
    p.add_argument(
        "--unshared-prompts",
        action="store_true",
        help="also run the engine with actor.share_prompts=false (each sequence computed whole): "
        "engine_unshared_prompts",
    )
    p.add_argument(
        "--grpo",
        nargs=4,
        type=int,
        metavar=("PROMPTS", "ANSWERS", "PROMPT_LEN", "ANSWER_LEN"),
        help="a GRPO-shaped batch instead of --seqs/--min-len/--max-len: ANSWERS rows per prompt, the loss "
        "on the answers (e.g. 64 8 235 192: the pipeline A/B's 0.5B step)",
    )
    p.add_argument(
        "--actor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an actor setting for every engine run (e.g. fused_logprobs=true); repeatable",
    )
    p.add_argument("--profile", metavar="TXT", help="also profile one engine step; write the kernel table here")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "areal-bench-train"))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    backend = "cuda:nccl,cpu:gloo" if args.device == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank, world = dist.get_rank(), dist.get_world_size()
    from areal.config.parallel import ParallelStrategyError, parse_parallel

    args.backend = args.backend or f"fsdp:d{world}"
    try:
        strategy = parse_parallel(args.backend, allowed_backends=("fsdp",))
    except ParallelStrategyError as e:
        p.error(f"--backend: {e}")
    if strategy.world_size != world:
        p.error(
            f"--backend {args.backend} uses {strategy.world_size} processes (d x t) but {world} were started "
            f"(torchrun --nproc-per-node {strategy.world_size})"
        )
    if args.seqs % strategy.dp:
        p.error(f"--seqs {args.seqs} does not split over the {strategy.dp} data-parallel ranks of {args.backend}")
    root = Path(args.workdir)
    if rank == 0:
        build_model_dir(args.shape, root)
    dist.barrier()
    model_dir, tok_dir = build_model_dir(args.shape, root)
    cfg = AutoConfig.from_pretrained(model_dir)
    if args.grpo:
        prompts, answers, prompt_len, answer_len = args.grpo
        args.seqs, args.min_len, args.max_len = prompts * answers, prompt_len + answer_len // 2, prompt_len + answer_len
        batch = make_grpo_batch(prompts, answers, prompt_len, answer_len, cfg.vocab_size)
    else:
        batch = make_batch(args.seqs, args.min_len, args.max_len, cfg.vocab_size)
    common = _actor_settings(p, args.actor)
    real = int(batch["attention_mask"].sum())
    padded = batch["input_ids"].numel()
    avg_len = real / args.seqs
    result = {
        "shape": args.shape,
        "device": args.device,
        "world_size": world,
        "backend": args.backend,
        "dp": strategy.dp,
        "tp": strategy.tp,
        "hsdp_replicate": strategy.replicate,
        "dtype": args.dtype,
        "seqs": args.seqs,
        "len_range": [args.min_len, args.max_len],
        "max_tokens_per_mb": args.max_tokens_per_mb,
        "gradient_checkpointing": args.gradient_checkpointing,
        "matmul_params": matmul_params(cfg),
        "flops_per_token": flops_per_token(cfg, avg_len),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
    }
    result["engine"] = summarise(
        bench_engine(args, model_dir, tok_dir, batch, profile=args.profile, **common),
        real,
        padded,
        cfg,
        avg_len,
        args,
        world,
    )
    _release(args.device)
    for name, (flag, options) in ENGINE_VARIANTS.items():
        if getattr(args, flag):
            profile = args.profile and args.profile.replace(".txt", "") + name.removeprefix("engine") + ".txt"
            run = bench_engine(args, model_dir, tok_dir, batch, profile=profile, **{**common, **options})
            result[name] = summarise(run, real, padded, cfg, avg_len, args, world)
            _release(args.device)
    if not args.skip_bare:
        result["bare_fsdp2_backend"] = f"fsdp:d{world}"
        result["bare_fsdp2"] = summarise(bench_bare(args, model_dir, batch), real, padded, cfg, avg_len, args, world)
        for name in ("engine", *ENGINE_VARIANTS):
            if name in result:
                result[f"{name}_speedup_vs_bare"] = (
                    result["bare_fsdp2"]["median_step_s"] / result[name]["median_step_s"]
                )
    if rank == 0:
        Path(args.out).write_text(json.dumps(result, indent=1))
        runs = ("engine", *ENGINE_VARIANTS, "bare_fsdp2")
        print(json.dumps({k: v for k, v in result.items() if k not in runs}))
        for name in runs:
            if name in result:
                r = result[name]
                print(
                    f"{name} ({args.backend if name.startswith('engine') else f'fsdp:d{world}'}): "
                    f"{r['tokens_per_s']:.0f} tok/s ({r['tokens_per_s_per_device']:.0f} per device), "
                    f"step {r['median_step_s']:.3f} s"
                    + (f", MFU {r['mfu']:.3f}, peak {r['peak_memory_gib']:.1f} GiB" if "mfu" in r else "")
                    + (f", MFU of computed tokens {r['mfu_computed']:.3f}" if "mfu_computed" in r else "")
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
