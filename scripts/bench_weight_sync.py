"""Weight updates from the trainer to a built-in server: seconds and GB/s, split into gather,
transfer and load, for disk, distributed (NCCL on GPU, gloo on CPU) and tensor (through memory:
CUDA IPC handles on GPU, shared memory on CPU) updates.

One process is the trainer (an FSDPEngine, dp=1, on the first GPU); it starts one built-in server
(`python -m areal.server`, on the second GPU: CUDA_VISIBLE_DEVICES=<second visible GPU>) with the
same random-weight Qwen2.5-shaped folder (scripts/model_shapes.py, no download), then for
each mode (broadcast first, disk last) does a warm-up update and --repeats timed ones. Run it with
plain python, not torchrun; SIGTERM (e.g. from `timeout`) stops the server and keeps the JSON.

    # GPU (2 GPUs: trainer on the first, server on the second); a few minutes
    python scripts/bench_weight_sync.py --shape qwen2.5-0.5b qwen2.5-1.5b --device cuda \
        --modes disk nccl --out bench_weight_sync.json
    # ONE GPU: the server shares the trainer's GPU (colocated); tensor against disk
    python scripts/bench_weight_sync.py --shape qwen2.5-0.5b qwen2.5-1.5b --device cuda \
        --modes tensor disk --out bench_weight_sync_1gpu.json
    # CPU smoke run (tiny model; about half a minute on an idle 2-core machine)
    python scripts/bench_weight_sync.py --shape tiny --device cpu --modes disk gloo --repeats 2 \
        --out /tmp/ws.json

Split of one update (medians over the timed updates; GB/s = weight bytes / seconds, 1 GB = 1e9 B):
  gather    trainer: full tensors out of the FSDP shards + cast to the update dtype (disk: + copy
            to host memory);
  transfer  disk: writing the safetensors folder (to --disk-dir: /dev/shm when it has room);
            distributed: the per-bucket HTTP notices and broadcasts, minus the server's load;
  load      disk: the servers loading the folder (trainer's wait for the HTTP answer; the
            server's own number is server_load_s); distributed: the server copying the received
            tensors into its model (server_load_s, as the server reports it);
  other     the rest (pause/resume of generation, barriers).
The distributed update runs for each --bucket-mb (actor.weight_update_bucket_mb).

After the timed updates of each mode the trainer's weights are perturbed, the server's logprobs
are checked to differ from the trainer's, one more update is sent, and they must then match
(and the server must report the new version): a fast but wrong update fails the run (exit 1).
Writes one JSON object (--out), rewritten after every measurement so a partial run keeps its
numbers; `rows` in it is the flat table (shape, mode, bucket_mb, seconds, gb_per_s, *_s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from model_shapes import SHAPES, build_model_dir

from areal.engine.sglang.control import ServerControl
from areal.trainer.sources import push_to_control

T0 = time.perf_counter()
PROMPT_LEN, NEW_TOKENS = 16, 16


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs="+", choices=sorted(SHAPES), default=["qwen2.5-0.5b"])
    p.add_argument(
        "--modes",
        nargs="+",
        choices=["disk", "nccl", "gloo", "tensor"],
        default=None,
        help="default: disk nccl on cuda, disk gloo on cpu",
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="trainer compute dtype = update dtype = server dtype",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed updates per mode and bucket size")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--bucket-mb",
        type=int,
        nargs="+",
        default=[64, 256, 1024],
        help="actor.weight_update_bucket_mb values for distributed updates",
    )
    p.add_argument(
        "--disk-dir",
        default=None,
        help="where disk updates are written; default /dev/shm when it has room, else the temp dir",
    )
    p.add_argument(
        "--workdir",
        default=os.path.join(tempfile.gettempdir(), "areal-bench-train"),
        help="model folders (shared with bench_train.py and bench_e2e.py)",
    )
    p.add_argument(
        "--server-gpu", default=None, help="CUDA_VISIBLE_DEVICES of the server; default: the second visible GPU"
    )
    p.add_argument("--server-timeout", type=float, default=600.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.modes = args.modes or (["disk", "nccl"] if args.device == "cuda" else ["disk", "gloo"])
    # the broadcast (the goal's number, and quick) before disk, so a run cut short keeps it
    args.modes = sorted(dict.fromkeys(args.modes), key=lambda m: m == "disk")
    if args.device == "cpu" and "nccl" in args.modes:
        p.error("--modes nccl needs --device cuda (use gloo on CPU)")
    if args.device == "cuda" and "gloo" in args.modes:
        p.error("--modes gloo is the CPU path; use nccl with --device cuda")
    if "tensor" in args.modes and "nccl" in args.modes:
        p.error(
            "--modes tensor puts the server on the trainer's GPU, where nccl cannot reach it; "
            "measure them in separate calls"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no GPU")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        p.error("run with plain python (one trainer process), not torchrun")
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    return args


# ---- setup -----------------------------------------------------------------------------------
def server_gpu(args) -> str:
    """The server's CUDA_VISIBLE_DEVICES: the second GPU the trainer can see, or the trainer's
    own (the first) for tensor updates, which hand the server CUDA IPC handles."""
    if args.server_gpu is not None:
        return args.server_gpu
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if "tensor" in args.modes:
        return visible.split(",")[0].strip() if visible else "0"
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if len(ids) >= 2:
            return ids[1]
        raise SystemExit(
            f"CUDA_VISIBLE_DEVICES={visible!r} shows one GPU; the server needs a second (or pass --server-gpu)"
        )
    if torch.cuda.device_count() < 2:
        raise SystemExit(
            "one GPU visible: the server needs a second one (NCCL cannot join two ranks "
            "on one GPU); pass --server-gpu to share it for disk updates only"
        )
    return "1"


def folder_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def pick_disk_dir(args, need_bytes: int) -> tuple[str, str]:
    """A fast local folder for disk updates, and a word on what it is."""
    if args.disk_dir:
        root = args.disk_dir
    elif os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 3 * need_bytes:
        root = "/dev/shm"
    else:
        root = tempfile.gettempdir()
    path = tempfile.mkdtemp(prefix="areal-bench-ws-", dir=root)
    return path, fs_type(path)


def fs_type(path: str) -> str:
    """Filesystem type of the mount holding path (from /proc/mounts; 'unknown' elsewhere)."""
    best, kind = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def start_server_for(args, model_dir: str, disk_root: str):
    from areal.infra.server_process import start_builtin_server as start_server
    from areal.server.args import build_parser

    extra = [
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--skip-tokenizer-init",
        "--max-running-requests",
        "4",
        "--log-level",
        "warning",
    ]
    if any("--weight-dirs" in a.option_strings for a in build_parser()._actions):
        extra += ["--weight-dirs", disk_root]  # disk loads are limited to allowed folders
    env = {"CUDA_VISIBLE_DEVICES": server_gpu(args)} if args.device == "cuda" else {}
    return start_server(model_dir, extra_args=extra, env=env, timeout=args.server_timeout)


# ---- one update and its split ---------------------------------------------------------------------
def make_meta(mode: str, version: int, group: str):
    from areal.api.weights import WeightUpdateMeta

    if mode in ("disk", "tensor"):
        return WeightUpdateMeta(type=mode, version=version)
    return WeightUpdateMeta(
        type="distributed", backend=mode, version=version, group_name=group, master_address="127.0.0.1", master_port=0
    )


def split(mode: str, stats: dict) -> dict:
    """gather / transfer / load / other seconds of one update (they add up to its seconds)."""
    get = lambda key: float(stats.get(f"weight_update/{key}_s", 0.0))  # noqa: E731
    server_load = get("server_load")
    if mode == "disk":
        parts = {"gather": get("gather"), "transfer": get("transfer"), "load": get("load")}
    else:  # the trainer's transfer phase waits for the servers' answers, which include their load
        parts = {"gather": get("gather"), "transfer": max(0.0, get("transfer") - server_load), "load": server_load}
    parts["other"] = stats["weight_update/seconds"] - sum(parts.values())
    parts["server_load"] = server_load
    return parts


def timed_updates(engine, control, mode: str, version: int, args, group: str) -> tuple[list[dict], int]:
    samples = []
    for k in range(args.warmup + args.repeats):
        version += 1
        if args.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter()
        stats = push_to_control(engine, make_meta(mode, version, group), control)
        wall = time.perf_counter() - wall
        if mode == "disk":
            shutil.rmtree(engine.weight_update_path(version), ignore_errors=True)
        parts = split(mode, stats)
        tag = "warm-up" if k < args.warmup else f"{k - args.warmup + 1}/{args.repeats}"
        log(
            f"  {mode} v{version} {tag}: {stats['weight_update/seconds']:.3f} s "
            + " ".join(f"{n}={v:.3f}" for n, v in parts.items())
        )
        if k >= args.warmup:
            samples.append(
                {
                    "seconds": stats["weight_update/seconds"],
                    "wall_s": wall,
                    "bytes": int(stats["weight_update/bytes"]),
                    "split_s": parts,
                    "raw": {k2: v for k2, v in stats.items() if k2.endswith("_s")},
                }
            )
    return samples, version


def summarise(samples: list[dict], bucket_mb) -> dict:
    nbytes = samples[0]["bytes"]
    seconds = statistics.median(s["seconds"] for s in samples)
    parts = {n: statistics.median(s["split_s"][n] for s in samples) for n in samples[0]["split_s"]}
    return {
        "bucket_mb": bucket_mb,
        "seconds": seconds,
        "bytes": nbytes,
        "gb": nbytes / 1e9,
        "gb_per_s": nbytes / seconds / 1e9,
        "split_s": parts,
        "split_gb_per_s": {
            n: (nbytes / v / 1e9 if v > 0 else None) for n, v in parts.items() if n in ("gather", "transfer", "load")
        },
        "min_seconds": min(s["seconds"] for s in samples),
        "samples": samples,
    }


# ---- consistency -------------------------------------------------------------------------------
def logprob_gap(engine, url: str, seed: int) -> dict:
    """Server logprobs of a sampled continuation vs the trainer's logprobs of the same tokens."""
    import requests

    vocab = engine.hf_config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist()
    resp = requests.post(
        url + "/generate",
        json={
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
        },
        timeout=300,
    )
    resp.raise_for_status()
    out = resp.json()["meta_info"]["output_token_logprobs"]
    ids = torch.tensor([prompt + [int(t) for _, t, _ in out]])
    mine = engine.forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)})[0, len(prompt) :]
    gap = (mine - torch.tensor([float(v) for v, _, _ in out])).abs()
    version = requests.get(url + "/model_info", timeout=30).json()["weight_version"]
    return {"mean": float(gap.mean()), "max": float(gap.max()), "server_version": version}


@torch.no_grad()
def perturb(engine, seed: int) -> None:
    """Change every trainer weight (its local shard) so a stale server is visible in logprobs."""
    from torch.distributed.tensor import DTensor

    for k, param in enumerate(engine.model.parameters()):
        local = param.to_local() if isinstance(param, DTensor) else param.data
        g = torch.Generator(device=local.device).manual_seed(seed * 100003 + k)
        noise = torch.randn(local.shape, generator=g, device=local.device, dtype=local.dtype)
        scale = 0.2 if local.dim() < 2 or local.numel() < 2 else 0.5 * float(local.float().std())
        local.add_(noise * scale)


def consistency_check(engine, control, url: str, mode: str, version: int, group: str, seed: int) -> dict:
    """Perturb, see the server differ, update once more, see it match (and the version)."""
    perturb(engine, seed)
    before = logprob_gap(engine, url, seed)
    stats = push_to_control(engine, make_meta(mode, version, group), control)
    if mode == "disk":
        shutil.rmtree(engine.weight_update_path(version), ignore_errors=True)
    after = logprob_gap(engine, url, seed)
    # bf16 on both sides with different kernels: a loose absolute tolerance; the stale server's
    # gap must stand well above that noise (else the check would prove nothing)
    tol = 0.01 if engine.config.dtype == "float32" else 0.1
    checks = {
        "version": after["server_version"] == str(version),
        "after_mean_within_tol": after["mean"] <= tol,
        "stale_server_detected": before["mean"] >= 5 * max(after["mean"], 1e-3),
    }
    result = {
        "passed": all(checks.values()),
        "checks": checks,
        "version": version,
        "tolerance": tol,
        "gap_before": before,
        "gap_after": after,
        "update_seconds": stats["weight_update/seconds"],
    }
    log(
        f"  {mode} check: {'PASSED' if result['passed'] else 'FAILED'} gap before "
        f"{before['mean']:.4f} (max {before['max']:.4f}), after {after['mean']:.4f} "
        f"(max {after['max']:.4f}), server version {after['server_version']!r} (want {version})"
    )
    return result


# ---- driver --------------------------------------------------------------------------------
def bench_shape(args, shape: str, index: int, result: dict, write) -> dict:
    from areal.engine.fsdp.engine import FSDPEngine

    out: dict = {"modes": {}}
    result["shapes"][shape] = out  # filled in as it goes: a run cut short keeps what it measured
    t = time.perf_counter()
    log(f"[{shape}] model folder under {args.workdir}")
    model_dir, tok_dir = build_model_dir(shape, Path(args.workdir))
    out["build_s"] = time.perf_counter() - t
    out["model_bytes_on_disk"] = folder_bytes(model_dir)
    disk_root, disk_fs = pick_disk_dir(args, out["model_bytes_on_disk"] * (2 if args.dtype == "float32" else 1))
    out["disk_dir"], out["disk_fs"] = disk_root, disk_fs
    log(
        f"[{shape}] {out['model_bytes_on_disk'] / 1e9:.2f} GB folder; starting the server "
        f"({args.device}) and the trainer; disk updates go to {disk_root} ({disk_fs})"
    )
    pool = ThreadPoolExecutor(1)
    server_future = pool.submit(start_server_for, args, model_dir, disk_root)  # loads while the trainer does
    engine = server = control = None
    try:
        t = time.perf_counter()
        engine = FSDPEngine.from_pretrained(
            model_dir,
            tokenizer_path=tok_dir,
            dtype=args.dtype,
            trainable=False,
            device=args.device,
            fileroot=disk_root,
            experiment_name="bench_weight_sync",
            trial_name=shape,
        )
        out["trainer_init_s"] = time.perf_counter() - t
        out["params"] = sum(p.numel() for p in engine.model.parameters())
        server = server_future.result()
        out["server_ready_s"] = time.perf_counter() - t
        log(
            f"[{shape}] trainer ready in {out['trainer_init_s']:.1f} s ({out['params'] / 1e6:.1f} M "
            f"params), server at {server.url} after {out['server_ready_s']:.1f} s"
        )
        control = ServerControl([server.url], pause_mode="abort")
        version, group = 0, f"bench_ws_{index}"
        for mode in args.modes:
            runs = []
            out["modes"][mode] = {"runs": runs, "best": None, "check": None}
            for mb in [None] if mode == "disk" else args.bucket_mb:
                if mb is not None:
                    engine.config.weight_update_bucket_mb = mb
                log(f"[{shape}] {mode}" + (f", bucket {mb} MB" if mb else ""))
                samples, version = timed_updates(engine, control, mode, version, args, group)
                runs.append(summarise(samples, mb))
                r = runs[-1]
                log(
                    f"[{shape}] {mode}{f' bucket {mb} MB' if mb else ''}: {r['seconds']:.3f} s, "
                    f"{r['gb_per_s']:.2f} GB/s ({r['gb']:.3f} GB); "
                    + ", ".join(f"{n} {v:.3f} s" for n, v in r["split_s"].items())
                )
                write()
            best = min(runs, key=lambda r: r["seconds"])
            version += 1
            check = consistency_check(engine, control, server.url, mode, version, group, seed=1000 * index + version)
            out["modes"][mode].update(best={k: v for k, v in best.items() if k != "samples"}, check=check)
            write()
    except BaseException:
        if server is not None:
            print(f"server log tail:\n{server.log()[-3000:]}", flush=True)
        raise
    finally:
        if control is not None:
            control.close()  # the broadcast group, before the engine's process group
        if engine is not None:
            engine.destroy()
        if server is None:  # the trainer failed first: wait for the server, then stop it
            try:
                server = server_future.result()
            except Exception:  # start_server stops a server that failed to come up
                server = None
        if server is not None:
            server.stop()
        pool.shutdown(wait=True)
        shutil.rmtree(disk_root, ignore_errors=True)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        log(f"[{shape}] trainer and server stopped")
    return out


def rows(result: dict) -> list[dict]:
    """One flat line per (shape, mode, bucket): the table to read first."""
    table = []
    for shape, out in result["shapes"].items():
        for mode, m in out.get("modes", {}).items():
            for r in m["runs"]:
                table.append(
                    {
                        "shape": shape,
                        "mode": mode,
                        "bucket_mb": r["bucket_mb"],
                        "seconds": round(r["seconds"], 4),
                        "gb_per_s": round(r["gb_per_s"], 3),
                        **{f"{n}_s": round(v, 4) for n, v in r["split_s"].items()},
                        "check_passed": m["check"]["passed"] if m["check"] else None,
                    }
                )
    return table


def main(argv=None) -> int:
    import transformers
    from transformers.utils import logging as hf_logging

    args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():  # finally blocks stop the server
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hf_logging.disable_progress_bar()  # keep the log to one line per step
    result = {
        "script": "bench_weight_sync",
        "device": args.device,
        "dtype": args.dtype,
        "modes": args.modes,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "bucket_mb": args.bucket_mb,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "server_gpu": server_gpu(args) if args.device == "cuda" else None,
        "shapes": {},
        "errors": {},
    }

    def write() -> None:
        result["rows"] = rows(result)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))

    log(
        f"bench_weight_sync: shapes {args.shape}, modes {args.modes}, device {args.device}, "
        f"dtype {args.dtype}, buckets {args.bucket_mb} MB, out {args.out}"
    )
    for index, shape in enumerate(args.shape):
        try:
            bench_shape(args, shape, index, result, write)
        except Exception as exc:  # keep going: the other shape's numbers are still worth having
            traceback.print_exc()
            result["errors"][shape] = f"{type(exc).__name__}: {exc}"
            log(f"[{shape}] FAILED: {result['errors'][shape]}")
        write()
    checks = [
        bool(m["check"] and m["check"]["passed"])
        for out in result["shapes"].values()
        for m in out.get("modes", {}).values()
    ]
    result["checks_passed"] = bool(checks) and all(checks) and not result["errors"]
    nccl = result["shapes"].get("qwen2.5-1.5b", {}).get("modes", {}).get("nccl")
    if nccl and nccl["best"]:
        result["goal_nccl_1.5b_under_1s"] = nccl["best"]["seconds"] < 1.0
    write()
    for row in result["rows"]:
        print(json.dumps(row), flush=True)
    log(f"checks {'passed' if result['checks_passed'] else 'FAILED'}; wrote {args.out}")
    sys.stdout.flush()
    return 0 if result["checks_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
