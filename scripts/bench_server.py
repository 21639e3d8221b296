"""Throughput of the built-in server (continuous batching) against sequential `generate`.

Run (CPU, builds a random tiny Llama: hidden 256, 4 layers, unless --model-path is given):

    .venv/bin/python scripts/bench_server.py --out /tmp/bench_server.json
    .venv/bin/python scripts/bench_server.py --cpu-threads 1 --out ...    # shared CPU box
    .venv/bin/python scripts/bench_server.py --with-256 --new-tokens 128 --out bench.json  # GPU
    # SGLang beside the built-in server, the same waves (GPU, pip install sglang==0.5.16):
    python scripts/bench_server.py --servers builtin sglang --attention-backend triton \
        --model-path smollm2:135m-instruct --concurrency 1 64 256 --new-tokens 128 --out decode.json

What it measures, on the same model, device and dtype:
  * baseline: `model.generate` one request at a time (greedy, fixed length via min_new_tokens);
  * server: N concurrent /generate requests (greedy, ignore_eos, fixed max_new_tokens) for N in
    1, 16, 64 (and 256 with --with-256); tokens/s = generated tokens / wall time of the wave.
It prints a table and writes a JSON result (--out) with the speedup of each N over the baseline.
With --servers builtin sglang each program serves the same waves in turn (SGLang after an untimed
wave at every N: it compiles kernels per batch shape on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="Where to write the JSON result.")
    p.add_argument("--model-path", default=None, help="HF model folder; default: a tiny model.")
    p.add_argument(
        "--shape",
        default=None,
        help="A random-weight real architecture instead "
        "(scripts/model_shapes.py SHAPES, e.g. qwen2.5-0.5b), with the project's tokenizer.",
    )
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", default=None, help="Default: float32 on CPU, bfloat16 on CUDA.")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--baseline-requests", type=int, default=4, help="Sequential generate() calls timed for the baseline."
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="torch CPU threads for both sides (OMP_NUM_THREADS for the server); "
        "1 gives stable numbers on a shared, oversubscribed machine.",
    )
    p.add_argument("--with-256", action="store_true", help="Also run 256 concurrent requests.")
    p.add_argument(
        "--servers", nargs="+", choices=("builtin", "sglang"), default=["builtin"], help="Server programs, in turn."
    )
    p.add_argument("--attention-backend", default="triton", help="SGLang's --attention-backend.")
    p.add_argument("--mem-fraction", type=float, default=0.5, help="SGLang's --mem-fraction-static.")
    return p.parse_args(argv)


def resolve(args):
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    return device, dtype


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def baseline_tokens_per_s(model_path, device, dtype, prompts, new_tokens) -> float:
    """Sequential transformers.generate, fixed output length, after one warm-up call."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    model = model.to(device).eval()

    def run(prompt):
        ids = torch.tensor([prompt], device=device)
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=0,
        )

    run(prompts[0])
    _sync(device)
    start = time.perf_counter()
    for prompt in prompts:
        run(prompt)
    _sync(device)
    elapsed = time.perf_counter() - start
    return len(prompts) * new_tokens / elapsed


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


async def wave(url: str, prompts, new_tokens: int) -> dict:
    """Send all prompts at once; wall time until the last answer."""
    import aiohttp

    body = lambda p: {  # noqa: E731
        "input_ids": p,
        "sampling_params": {
            "max_new_tokens": new_tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
    }
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(p):
            async with session.post(url + "/generate", json=body(p)) as r:
                r.raise_for_status()
                out = await r.json()
                return len(out["output_ids"]), out["meta_info"]["e2e_latency"]

        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        elapsed = time.perf_counter() - start
    tokens = sum(n for n, _ in results)
    return {
        "requests": len(prompts),
        "tokens": tokens,
        "wall_s": round(elapsed, 3),
        "tokens_per_s": round(tokens / elapsed, 1),
        "mean_latency_s": round(sum(lat for _, lat in results) / len(results), 3),
    }


def start_builtin(args, model_path, device, dtype, max_running, tokenizer_path, env):
    from areal.infra.server_process import start_builtin_server as start_server

    extra = ["--device", device, "--dtype", dtype, "--max-running-requests", str(max_running)]
    if tokenizer_path:
        extra += ["--tokenizer-path", tokenizer_path]
    return start_server(model_path, extra_args=[*extra, "--log-level", "warning"], timeout=600, env=env)


class SGLangServer:
    """`python -m sglang.launch_server` on a free port, stopped with its process group."""

    def __init__(self, command: list[str], port: int, log: Path):
        import os
        import subprocess

        self.url, self.log = f"http://127.0.0.1:{port}", log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ)
            )

    def stop(self) -> None:
        import os
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


def start_sglang(args, model_path, device, dtype, max_running, tokenizer_path, env):
    import sys

    from areal.config.sglang import SGLangConfig
    from areal.infra.health import wait_healthy
    from areal.infra.host import detect_host_facts
    from areal.infra.ports import free_port
    from areal.infra.servers import server_command

    port = free_port()
    cfg = SGLangConfig(
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        dtype=dtype,
        attention_backend=args.attention_backend,
        mem_fraction_static=args.mem_fraction,
        max_running_requests=max_running,
    )
    facts = detect_host_facts()  # the same command line areal-launch gives SGLang
    command = server_command(
        cfg,
        port=port,
        kind="sglang",
        python=sys.executable,
        sglang_version=facts.sglang_version,
        sglang_flags=facts.sglang_flags,
    )
    server = SGLangServer(command, port, Path(tempfile.gettempdir()) / f"bench-sglang-{port}.log")
    try:
        addr = server.url.removeprefix("http://")
        wait_healthy({addr: addr}, 900, lambda a: server.proc.poll(), timeout_key="bench_server's 900 s")
    except BaseException:
        server.stop()
        raise
    return server


def main(argv=None) -> dict:
    import requests

    from areal.models.tiny import make_tiny_model_dir

    args = parse_args(argv)
    device, dtype = resolve(args)
    env = {}
    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)
        env = {"OMP_NUM_THREADS": str(args.cpu_threads)}
    levels = sorted(set(args.concurrency) | ({256} if args.with_256 else set()))
    tokenizer_path = None
    if args.model_path:  # a project name (smollm2:..., tiny:...) becomes its folder
        from areal.models.resolve import resolve_model_path

        args.model_path = resolve_model_path(args.model_path)
    if args.shape:
        from model_shapes import build_model_dir

        args.model_path, tokenizer_path = build_model_dir(args.shape, Path(tempfile.gettempdir()) / "areal-bench-train")
    model_path = args.model_path or str(
        make_tiny_model_dir(
            Path(tempfile.gettempdir()) / f"bench-tiny-h{args.hidden_size}-l{args.num_layers}",
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            max_position=args.prompt_len + args.new_tokens + 8,
        )
    )
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(model_path)
    vocab = model_config.vocab_size
    if args.model_path:  # report the model's own size, not the tiny-model defaults
        args.hidden_size, args.num_layers = model_config.hidden_size, model_config.num_hidden_layers
    prompts = make_prompts(max(levels + [args.baseline_requests]), args.prompt_len, vocab)
    base = baseline_tokens_per_s(model_path, device, dtype, prompts[: args.baseline_requests], args.new_tokens)
    print(f"baseline sequential generate: {base:.1f} tok/s", flush=True)
    results, batching = {}, {}
    for program in args.servers:
        start = start_builtin if program == "builtin" else start_sglang
        server = start(args, model_path, device, dtype, max(levels), tokenizer_path, env)
        try:
            warm_levels = levels if program == "sglang" else [2]  # SGLang: compile each batch shape first
            for n in warm_levels:
                asyncio.run(wave(server.url, prompts[:n], 4))
            results[program] = {}
            for n in levels:
                res = asyncio.run(wave(server.url, prompts[:n], args.new_tokens))
                res["speedup_vs_sequential"] = round(res["tokens_per_s"] / base, 2)
                results[program][str(n)] = res
                print(
                    f"{program:>8} {n:>4} concurrent: {res['tokens_per_s']:>9.1f} tok/s  "
                    f"x{res['speedup_vs_sequential']:<6} wall {res['wall_s']}s",
                    flush=True,
                )
            if program == "builtin":
                batching = requests.get(server.url + "/server_info").json()["batching"]
        finally:
            server.stop()
    report = {
        "device": device,
        "dtype": dtype,
        "model_path": model_path,
        "shape": args.shape,
        "cpu_threads": args.cpu_threads,
        "hidden_size": args.hidden_size,
        "num_layers": args.num_layers,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "baseline_sequential_tokens_per_s": round(base, 1),
        "server": results.get("builtin", {}),
        "sglang": results.get("sglang"),
        "server_batching_stats": batching,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
