"""End-to-end GRPO throughput, synchronous against asynchronous RL.

Inference servers (--servers, one GPU each) and an FSDP trainer (--trainer-backend: fsdp:d1 on
one GPU by default; fsdp:d2, HSDP fsdp:d2r2 or tensor-parallel fsdp:d1t2 on two), run through
`areal-launch` (the local launcher, the gsm8k_grpo recipe) once per trainer layout and per
`rollout.max_head_offpolicyness` value:
0 (synchronous: generation and training alternate) and 2 and 4 (asynchronous: the next batch is
generated while the trainer trains). The model is a random-weight Qwen2.5 shape built from its
public config (scripts/model_shapes.py; the project's character tokenizer), the prompts are real
GSM8K questions, and every sample generates exactly --max-new-tokens tokens (ignore_eos), so all
modes do the same work per step. Per mode it reports, over the measured steps (the first
--warmup steps are excluded): samples/s, generated tokens/s, seconds per phase of a step
(rollout wait, logprob recompute, train, weight update), the trainer's rate over all the tokens
it trains on (prompts included: train_tokens_per_s, and train_mfu as bench_train counts it; with
shared prompts, on by default on CUDA, train_mfu_computed, "cMFU", counts only the tokens computed) and
the fraction of time each GPU was busy (NVML utilization sampled in a background thread; null on
CPU). The target: asynchronous
at least 1.8x synchronous.

    # GPU: 2 devices (server on GPU 0, trainer on GPU 1); about 2-2.5 min per mode
    python scripts/bench_e2e.py --data data/gsm8k/train.jsonl --out bench_e2e.json
    # 4 GPUs: two servers on GPUs 0,1, a 2-GPU trainer on 2,3; one call per layout
    python scripts/bench_e2e.py --data ... --servers 2 --trainer-backend fsdp:d2r2 --offpolicyness 0 2 --out ...
    # or several layouts in one call (each runs every --offpolicyness value)
    python scripts/bench_e2e.py --data ... --servers 2 --trainer-backend fsdp:d2 fsdp:d2r2 fsdp:d1t2 ...
    # tune the balance (see the "balance" and "hint" lines it prints): batch, samples, lengths
    python scripts/bench_e2e.py --data ... --batch-size 64 --n-samples 8 --max-new-tokens 192 --out ...
    # one mode per call when time is short (each call rebuilds nothing: models are cached in --workdir)
    python scripts/bench_e2e.py --data ... --offpolicyness 0 --out sync.json
    # one GPU: server and trainer colocated; sync time-shares the GPU, async splits its memory
    python scripts/bench_e2e.py --data ... --colocate --mem-fraction 0.4 --offpolicyness 0 2 --out ...
    # A/B in one call: each --variant (a name, then its overrides) runs every --offpolicyness value;
    # the first is the reference the others are compared with
    python scripts/bench_e2e.py --data ... --offpolicyness 2 --variant base \
        --variant logprobs actor.fused_logprobs=true actor.compile_logprobs=true \
        --variant no_radix sglang.disable_radix_cache=true --out ...
    # CPU smoke run (tiny model, about a minute on 2 cores)
    python scripts/bench_e2e.py --device cpu --shape tiny --batch-size 2 --n-samples 2 \
        --max-new-tokens 8 --steps 1 --warmup 1 --ppo-minibatches 1 --out /tmp/bench_e2e.json

Why the two phases should take about as long: a synchronous step costs generation + training +
weight update, an asynchronous one max(generation, training) + weight update, so the speedup
can reach 2x only when generation and training take equal time. The script prints the ceiling
the synchronous run's phase times allow.

GPU placement follows launcher/plan.py: servers take GPUs 0..N-1, the trainer's ranks the next
ones (N..N+W-1, W = the world size of --trainer-backend); utilization is reported per GPU under
its role (server-0, ..., trainer-0, ...).

Writes one JSON object (--out, rewritten after every run): config, hardware, and under "layouts"
one entry per --trainer-backend (per layout and --variant, keyed "LAYOUT/VARIANT", when variants
are given) with its per-mode results ("modes": sync, async2, async4),
"speedup" (asyncK_vs_sync by samples/s), "balance", "async_losses" (what keeps each async mode
from the ceiling, in seconds per step), "stopped_early" (modes cut by their time limit or failed)
and "goal_met" (null when a mode stopped early); the top-level "modes", "speedup", "balance",
"stopped_early" and "goal_met" are those of the first --trainer-backend (and variant). With
variants, "variants" compares each one's samples/s and trainer tokens/s per mode with the first's.
Steps the profiler traced (--override "profiler.steps=[N]") are left out of the figures: they
carry its cost.
Exit status 0 when every run completed all its steps, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_SPEEDUP = 1.8
PHASES = ("rollout", "advantages", "recompute_logprob", "train", "weight_update", "save", "eval")
RESERVE_S = 100.0  # --budget: time kept for each mode still to run


def say(msg: str) -> None:
    print(msg, flush=True)


def _token_budget(text: str) -> int | str:
    """--max-tokens-per-mb: what actor.max_tokens_per_mb takes (areal.config.actor.token_budget)."""
    from areal.config.actor import token_budget

    try:
        return token_budget(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def parse_args(argv=None):
    from model_shapes import SHAPES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the JSON result")
    p.add_argument(
        "--data",
        default=None,
        help="GSM8K train split: a train.jsonl / .parquet file or a folder holding one "
        "(default: $AREAL_GSM8K_DIR, else ../shared/data/gsm8k beside the checkout)",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--servers", type=int, default=1, help="inference servers, one GPU each (rollout.backend=sglang:dN)")
    p.add_argument(
        "--trainer-backend",
        nargs="+",
        default=["fsdp:d1"],
        metavar="FSDP",
        help="actor.backend, e.g. fsdp:d2, fsdp:d2r2 (HSDP 2x1), fsdp:d1t2 (tensor parallel 2); "
        "the trainer uses its world size in GPUs; several values: one run set per layout",
    )
    p.add_argument(
        "--offpolicyness",
        type=int,
        nargs="+",
        default=[0, 2, 4],
        help="rollout.max_head_offpolicyness values, one run each (0 = synchronous)",
    )
    p.add_argument("--steps", type=int, default=4, help="measured training steps per mode")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and excluded from the numbers")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per step (train_dataset.batch_size)")
    p.add_argument("--n-samples", type=int, default=4, help="samples per prompt (GRPO group size)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="fixed generation length (ignore_eos)")
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="rollout.max_concurrent_rollouts (episodes = prompts); default: --batch-size",
    )
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="sglang.max_running_requests (sequences decoded together per server); default: max-concurrent x n-samples",
    )
    p.add_argument("--ppo-minibatches", type=int, default=4, help="actor.ppo_n_minibatches")
    p.add_argument(
        "--max-tokens-per-mb",
        type=_token_budget,
        default=16384,
        help="actor.max_tokens_per_mb: tokens, or auto (sized from the free memory; the budgets used are "
        "reported as mb_token_budget_mean)",
    )
    p.add_argument(
        "--grad-ckpt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="actor.gradient_checkpointing (the recipe's default: on)",
    )
    p.add_argument(
        "--colocate",
        action="store_true",
        help="launcher.colocate: servers and trainer share the GPUs (one GPU runs both); the "
        "sync mode then time-shares the device (sglang.enable_memory_saver follows), the "
        "async modes split it (--mem-fraction)",
    )
    p.add_argument(
        "--mem-fraction",
        type=float,
        default=0.8,
        help="sglang.mem_fraction_static: the servers' share of each GPU's memory",
    )
    p.add_argument(
        "--offload",
        action="store_true",
        help="actor.offload: the trainer's state goes to CPU while the servers generate "
        "(colocated sync mode only; async modes ignore it)",
    )
    p.add_argument(
        "--weight-update",
        choices=("distributed", "disk", "tensor"),
        default=None,
        help="actor.weight_update (distributed = NCCL on GPU, gloo on CPU; tensor = CUDA IPC to a "
        "colocated server); default: tensor with --colocate, else distributed",
    )
    p.add_argument("--server", choices=("builtin", "sglang", "auto"), default="builtin", help="rollout.server")
    p.add_argument("--config", default="gsm8k_grpo.yaml", help="the experiment the overrides apply to")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override for every run (repeatable), e.g. --override actor.optimizer.lr=1e-6",
    )
    p.add_argument(
        "--variant",
        action="append",
        nargs="+",
        default=[],
        metavar="NAME [KEY=VALUE ...]",
        help="a run set: a name, then Hydra overrides applied after every other (repeatable); each variant "
        "runs every --offpolicyness value and is compared with the first variant",
    )
    p.add_argument(
        "--reward-p",
        type=float,
        default=None,
        help="score answers with scripts/bench_rewards.py:coin, 1 with this probability (the "
        "random-weight model's answers earn no real reward); with --override "
        "rollout.dynamic_sampling=true, groups of equal rewards are dropped at the rate it implies",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=None,
        help="seconds one mode may take, start-up included (default: 270 on cuda, 300 on cpu)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole script (default: 480 on cuda, none on cpu): a mode may use "
        "what is left minus 100 s per mode still to run; a mode cut short reports the "
        "steps it finished",
    )
    p.add_argument("--gpu-sample-s", type=float, default=0.1, help="GPU utilization sampling period")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="bf16 dense peak of one GPU for train_mfu (default: an H200's 790, as bench_train)",
    )
    p.add_argument("--port-base", type=int, default=31200, help="server port of the first run (+10 per run)")
    p.add_argument(
        "--master-port-base", type=int, default=29600, help="trainer rendezvous port of the first run (+10 per run)"
    )
    p.add_argument(
        "--workdir",
        default=os.path.join(tempfile.gettempdir(), "areal-bench-e2e"),
        help="models (cached across calls) and run directories",
    )
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.weight_update is None:
        args.weight_update = "tensor" if args.colocate else "distributed"
    if args.peak_tflops is None:
        from model_shapes import PEAK_TFLOPS_H200

        args.peak_tflops = PEAK_TFLOPS_H200
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if len(set(args.offpolicyness)) != len(args.offpolicyness) or min(args.offpolicyness) < 0:
        p.error("--offpolicyness takes distinct values >= 0")
    if args.servers < 1:
        p.error("--servers must be >= 1")
    if len(set(args.trainer_backend)) != len(args.trainer_backend):
        p.error("--trainer-backend takes distinct values")
    try:
        args.variants = parse_variants(args.variant)
    except ValueError as e:
        p.error(f"--variant: {e}")
    from areal.config.parallel import ParallelStrategyError, parse_parallel

    for spec in args.trainer_backend:
        try:
            parse_parallel(spec, allowed_backends=("fsdp",))
        except ParallelStrategyError as e:
            p.error(f"--trainer-backend: {e}")
    return args


VARIANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


PAUSE_COUNTS = ("requests_aborted", "requests_held", "requests_in_flight", "requests_drained", "drain_aborts")


def parse_variants(specs: list[list[str]]) -> dict[str, list[str]]:
    """--variant NAME [KEY=VALUE ...], repeated -> {name: overrides}, in the order given."""
    variants: dict[str, list[str]] = {}
    for name, *ovs in specs:
        if not VARIANT_NAME.fullmatch(name) or "=" in name:
            raise ValueError(f"{name!r} is no variant name: start with a letter or digit, then letters, digits, _ . -")
        if name in variants:
            raise ValueError(f"{name!r} is given twice: name each variant once")
        bad = [o for o in ovs if "=" not in o]
        if bad:
            raise ValueError(f"{name}: {bad[0]!r} is no Hydra override: write KEY=VALUE")
        variants[name] = ovs
    return variants


def run_sets(args) -> list[tuple[str, str | None]]:
    """(trainer layout, variant or None) per run set: every layout, each with every variant."""
    return [(b, v) for b in args.trainer_backend for v in (list(args.variants) or [None])]


def set_key(backend: str, variant: str | None) -> str:
    """The run set's key under "layouts": the layout, then "/VARIANT" when variants are given."""
    return backend if variant is None else f"{backend}/{variant}"


def mode_name(k: int) -> str:
    return "sync" if k == 0 else f"async{k}"


def trial_name(backend: str, k: int, args, variant: str | None = None) -> str:
    """The launcher trial (and run folder) of one run: the mode, prefixed by the layout unless it is
    the single default one (so the 2-GPU runs keep their names), then the variant's name if any."""
    if args.trainer_backend == ["fsdp:d1"] and args.servers == 1:
        name = mode_name(k)
    else:
        name = f"{backend.replace(':', '_')}_s{args.servers}_{mode_name(k)}"
    return name if variant is None else f"{name}_{variant}"


def gpu_roles(n_servers: int, trainer_backend: str, colocate: bool = False) -> dict[str, int]:
    """Role -> node-local GPU index, as launcher/plan.py places a single node: servers (tensor
    parallel 1, sglang:dN) on the first N devices, then the trainer's ranks in rank order; with
    colocate, the trainer's ranks from device 0 too (server i and trainer rank i share a GPU)."""
    from areal.config.parallel import parse_parallel

    world = parse_parallel(trainer_backend, allowed_backends=("fsdp",)).world_size
    roles = {f"server-{i}": i for i in range(n_servers)}
    first = 0 if colocate else n_servers
    roles.update({f"trainer-{j}": first + j for j in range(world)})
    return roles


def gpus_of(args, backend: str) -> int:
    return len(set(gpu_roles(args.servers, backend, args.colocate).values()))


def gpus_needed(args) -> int:
    return max(gpus_of(args, b) for b in args.trainer_backend)


# ---- set-up ---------------------------------------------------------------------------------------


def resolve_device(args) -> str:
    if args.device:
        return args.device
    return "cuda" if gpu_count() > 0 else "cpu"


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def check_cuda_layout(args, n: int | None = None) -> None:
    """The launcher gives each process CUDA_VISIBLE_DEVICES with node-local indices (gpu_roles) that
    replace (not index into) an inherited CUDA_VISIBLE_DEVICES, which the runs therefore do not get.
    The sampler watches those NVML indices (the runs set CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    n = gpu_count() if n is None else n
    need = gpus_needed(args)
    if n < need:
        widest = max(args.trainer_backend, key=lambda b: gpus_of(args, b))
        sys.exit(
            f"error: --device cuda with --servers {args.servers} and --trainer-backend {widest} needs "
            f"{need} GPUs ({args.servers} for the servers, {need - args.servers} for the trainer); "
            f"nvidia-smi lists {n}"
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return
    first = [str(i) for i in range(need)]
    if n > need and [d.strip() for d in visible.split(",")][:need] != first:
        sys.exit(
            f"error: CUDA_VISIBLE_DEVICES={visible!r} on a node with {n} GPUs: areal-launch places the "
            f"servers and the trainer on GPUs {','.join(first)} whatever it says; unset it or make it "
            f"start with {','.join(first)}"
        )
    say(
        f"note: CUDA_VISIBLE_DEVICES={visible!r} is not passed on; the launcher uses GPUs {','.join(first)} of the node"
    )


def resolve_data(path: str | None) -> str:
    path = path or os.environ.get("AREAL_GSM8K_DIR")
    if not path:
        default = REPO.parent / "shared" / "data" / "gsm8k"
        if not default.is_dir():
            sys.exit("error: pass --data (or set AREAL_GSM8K_DIR): a GSM8K train.jsonl or a folder with one")
        path = str(default)
    p = Path(path).expanduser().resolve()
    if not p.exists():
        sys.exit(f"error: --data {path}: no such file or folder")
    if p.is_dir() and not any(p.glob("train*")) and not any(p.glob("*/train*")):
        sys.exit(f"error: --data {path}: no train split there (expected train.jsonl or train-*.parquet)")
    return str(p)


def build_model(args, workdir: Path) -> tuple[str, str]:
    from model_shapes import build_model_dir

    t = time.perf_counter()
    model_dir, tok_dir = build_model_dir(args.shape, workdir / "models")
    say(f"model {args.shape}: {model_dir} (tokenizer {tok_dir}) ready in {time.perf_counter() - t:.1f} s")
    return model_dir, tok_dir


def overrides(
    args,
    k: int,
    index: int,
    model_dir: str,
    tok_dir: str,
    data: str,
    runs_root: Path,
    backend: str | None = None,
    variant: str | None = None,
) -> list[str]:
    """The run's Hydra overrides: the benchmark's settings, then --override, then the variant's
    (the last value of a key wins)."""
    backend = backend or args.trainer_backend[0]
    conc = args.max_concurrent or args.batch_size
    running = args.max_running_requests or conc * args.n_samples  # per server
    offset = 10 * index
    return [
        "experiment_name=bench_e2e",
        f"trial_name={trial_name(backend, k, args, variant)}",
        f"seed={args.seed}",
        f"cluster.fileroot={runs_root}",
        f"cluster.device={args.device}",
        "cluster.n_nodes=1",
        f"cluster.n_gpus_per_node={gpus_of(args, backend) if args.colocate else max(2, gpus_of(args, backend))}",
        f"launcher.colocate={str(args.colocate).lower()}",
        f"sglang.mem_fraction_static={args.mem_fraction}",
        f"actor.offload={str(args.offload and k == 0).lower()}",
        f"actor.path={model_dir}",
        f"actor.tokenizer_path={tok_dir}",
        f"actor.backend={backend}",
        f"actor.dtype={args.dtype}",
        f"actor.gradient_checkpointing={str(args.grad_ckpt).lower()}",
        f"actor.max_tokens_per_mb={args.max_tokens_per_mb}",
        f"actor.ppo_n_minibatches={args.ppo_minibatches}",
        f"actor.weight_update={args.weight_update}",
        f"rollout.backend=sglang:d{args.servers}",
        f"rollout.server={args.server}",
        f"rollout.max_head_offpolicyness={k}",
        f"rollout.max_concurrent_rollouts={conc}",
        f"gconfig.n_samples={args.n_samples}",
        f"gconfig.max_new_tokens={args.max_new_tokens}",
        "gconfig.min_new_tokens=0",
        "gconfig.ignore_eos=true",
        "gconfig.temperature=1.0",
        "gconfig.stop=[]",
        f"sglang.max_running_requests={running}",
        "sglang.context_length=null",
        "train_dataset.type=gsm8k",
        f"train_dataset.path={data}",
        f"train_dataset.batch_size={args.batch_size}",
        "train_dataset.max_samples=null",
        f"total_train_steps={args.warmup + args.steps}",
        "total_train_epochs=1000",
        "evaluator.freq_steps=null",
        "saver.freq_steps=null",
        "saver.save_at_end=false",
        "recover.mode=disabled",
        "recover.freq_steps=null",
        "stats_logger.tensorboard=false",
        "stats_logger.plot=false",
        f"launcher.server_base_port={args.port_base + offset}",
        f"launcher.trainer_master_port={args.master_port_base + offset}",
        *(["workflow.reward_fn=bench_rewards:coin"] if args.reward_p is not None else []),
        *args.override,
        *(args.variants[variant] if variant is not None else []),
    ]


# ---- GPU utilization ------------------------------------------------------------------------------


class GpuSampler:
    """(wall time, NVML index, utilization %, memory MiB) every `period` s, in a background thread.

    NVML through pynvml when importable, else a one-shot `nvidia-smi --query-gpu` per sample (a
    streaming `-lms` pipe is block-buffered, so its lines would arrive late). utilization.gpu is the
    share of the driver's last sampling window in which a kernel ran; its mean is the busy fraction.
    """

    def __init__(self, indices: list[int], period: float):
        self.indices, self.period = indices, period
        self.samples: list[tuple[float, int, float, float]] = []
        self.source = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "GpuSampler":
        read = self._pynvml_reader() or self._smi_reader()
        if read is None:
            return self
        self._thread = threading.Thread(target=self._loop, args=(read,), name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self, read) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                rows = read()
            except Exception as e:  # a sampler hiccup must not end the benchmark
                say(f"gpu sampler: {type(e).__name__}: {e}")
                rows = []
            now = time.time()
            self.samples += [(now, i, u, m) for i, u, m in rows]
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t)))

    def _pynvml_reader(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices}
        except Exception:
            return None
        self.source = "pynvml"

        def read():
            return [
                (i, float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu), pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20)
                for i, h in handles.items()
            ]

        return read

    def _smi_reader(self):
        if not shutil.which("nvidia-smi"):
            return None
        self.source = "nvidia-smi"
        cmd = [
            "nvidia-smi",
            "--query-gpu=index,utilization.gpu,memory.used",
            "--format=csv,noheader,nounits",
            "-i",
            ",".join(map(str, self.indices)),
        ]

        def read():
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
            rows = []
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 3 and all(x.replace(".", "").isdigit() for x in parts):
                    rows.append((int(parts[0]), float(parts[1]), float(parts[2])))
            return rows

        return read

    def summary(self, index: int, t0: float | None, t1: float | None) -> dict:
        mine = [s for s in self.samples if s[1] == index]
        window = [s for s in mine if t0 is not None and t1 is not None and t0 <= s[0] <= t1]
        return {
            "index": index,
            "busy_fraction": statistics.fmean(s[2] for s in window) / 100 if window else None,
            "samples": len(window),
            "peak_memory_mib": max((s[3] for s in mine), default=None),
        }


# ---- one mode -------------------------------------------------------------------------------------


def run_mode(
    args,
    k: int,
    index: int,
    model_dir: str,
    tok_dir: str,
    data: str,
    workdir: Path,
    *,
    timeout: float,
    backend: str | None = None,
    variant: str | None = None,
) -> dict:
    backend = backend or args.trainer_backend[0]
    name, total = trial_name(backend, k, args, variant), args.warmup + args.steps
    runs_root = workdir / "runs"
    run_dir = runs_root / "bench_e2e" / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh trial: no stale metrics.jsonl
    run_dir.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "--config",
        args.config,
        *overrides(args, k, index, model_dir, tok_dir, data, runs_root, backend, variant),
    ]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }  # CUDA index i is NVML index i
    env.setdefault("HF_HUB_OFFLINE", "1")  # every path is local: never wait on the hub
    if args.reward_p is not None:  # bench_rewards.py beside this script, importable by every process
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), env.get("PYTHONPATH")]))
        env["BENCH_REWARD_P"] = str(args.reward_p)
    if args.device == "cuda":
        env.pop("CUDA_VISIBLE_DEVICES", None)  # see check_cuda_layout ("" would hide the GPUs from it)
    roles = gpu_roles(args.servers, backend, args.colocate)
    say(
        f"\n== {name} ({set_key(backend, variant)}, {args.servers} server(s), max_head_offpolicyness={k}): "
        f"{total} steps, "
        f"the first {args.warmup} excluded; time limit {timeout:.0f} s"
    )
    say("$ areal-launch " + " ".join(cmd[3:]))
    sampler = GpuSampler(sorted(set(roles.values())), args.gpu_sample_s) if args.device == "cuda" else None
    if sampler:
        sampler.start()
    launcher_log = run_dir / "launcher.log"
    start = time.time()
    rows, arrivals, status = [], [], "ok"
    with open(launcher_log, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        metrics = run_dir / "metrics.jsonl"
        pos = 0
        try:
            while True:
                code = proc.poll()
                pos = _read_rows(metrics, pos, rows, arrivals, name, total, args.warmup, start)
                if code is not None:
                    break
                if time.time() - start > timeout:
                    say(f"[{name}] timed out after {timeout:.0f} s: stopping the launcher")
                    status = "timeout"
                    _stop(proc)
                    break
                time.sleep(0.2)
        except BaseException:  # Ctrl-C, or SIGTERM from an outer `timeout`: no orphaned run
            say(f"[{name}] interrupted: stopping the launcher")
            _stop(proc)
            if sampler:
                sampler.stop()
            raise
        _read_rows(metrics, pos, rows, arrivals, name, total, args.warmup, start)
    wall = time.time() - start
    if sampler:
        sampler.stop()
    steps = [r for r in rows if r.get("step", 0) > 0]
    if status == "ok" and (proc.returncode != 0 or len(steps) < total):
        status = "failed"
    result = summarise(args, k, steps, arrivals, sampler, start, roles)
    result.update(
        status=status,
        returncode=proc.returncode,
        wall_s=wall,
        run_dir=str(run_dir),
        steps_expected=total,
        steps_completed=len(steps),
    )
    if status != "ok":
        result["log_tail"] = _log_tails(run_dir)
        say(
            f"[{name}] {status} (exit {proc.returncode}, {len(steps)}/{total} steps); log tails:\n" + result["log_tail"]
        )
    else:
        say(
            f"[{name}] done in {wall:.0f} s: {result['samples_per_s']:.2f} samples/s, "
            f"{result['gen_tokens_per_s']:.0f} generated tokens/s" + _gpu_text(result["gpu"])
        )
    return result


def _read_rows(
    path: Path, pos: int, rows: list, arrivals: list, name: str, total: int, warmup: int, start: float
) -> int:
    """New complete lines of metrics.jsonl since byte `pos`; records their arrival time and prints them."""
    if not path.exists():
        return pos
    with open(path, "rb") as f:
        f.seek(pos)
        chunk = f.read()
    now = time.time()
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].decode().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        rows.append(row)
        arrivals.append(now)
        if row.get("step", 0) > 0:
            say(
                f"[{name}] step {row['step']}/{total}{' (warm-up)' if row['step'] <= warmup else ''} "
                f"at {now - start:.0f} s: {_step_text(row)}"
            )
    return pos + end


def _step_text(row: dict) -> str:
    ph = " | ".join(
        f"{p} {row[f'timing/{p}_s']:.2f}"
        for p in PHASES
        if isinstance(row.get(f"timing/{p}_s"), (int, float)) and row[f"timing/{p}_s"] >= 0.005
    )
    return (
        f"{row.get('timing/step_s', 0):.2f} s ({ph}); {row.get('rollout/n_samples')} samples, "
        f"{row.get('rollout/gen_tokens')} generated tokens, staleness {row.get('rollout/staleness_max')}"
    )


def _gpu_text(gpu: dict | None) -> str:
    if not gpu:
        return ""
    parts = [
        f"{role} busy {g['busy_fraction']:.0%}"
        for role, g in gpu.items()
        if isinstance(g, dict) and g.get("busy_fraction") is not None
    ]  # skips "source"
    return "; " + ", ".join(parts) if parts else ""


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher (it tears its processes down), SIGKILL its session if it lingers."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _log_tails(run_dir: Path, chars: int = 2500) -> str:
    out = []
    for path in [run_dir / "launcher.log", *sorted((run_dir / "logs").glob("*.log"))]:
        if path.exists():
            out.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
    return "\n".join(out)


def summarise(
    args, k: int, steps: list[dict], arrivals: list[float], sampler, start: float, roles: dict[str, int] | None = None
) -> dict:
    # a traced step (profiler.steps) pays the profiler's cost: its figures are not the pipeline's
    after_warmup = [r for r in steps if r["step"] > args.warmup]
    measured = [r for r in after_warmup if not r.get("profiler/traced")]
    step_arrivals = [t for r, t in zip_steps(steps, arrivals)]

    def total(key):
        return sum(float(r.get(key) or 0) for r in measured)

    def mean(key):
        vals = [float(r[key]) for r in measured if isinstance(r.get(key), (int, float))]
        return statistics.fmean(vals) if vals else None

    seconds = total("timing/step_s")
    trainer_s = total("timing/recompute_logprob_s") + total("timing/train_s")  # the trainer's passes
    expected_tokens = args.batch_size * args.n_samples * args.max_new_tokens
    update_parts = sorted(
        {
            k
            for r in measured
            for k in r
            if k.startswith("weight_update/") and (k.endswith("_s") or k.endswith(PAUSE_COUNTS))
        }
    )
    out = {
        "max_head_offpolicyness": k,
        "measured_steps": len(measured),
        "traced_steps_left_out": len(after_warmup) - len(measured),
        "measured_s": seconds,
        "samples_per_s": total("rollout/n_samples") / seconds if seconds else None,
        "gen_tokens_per_s": total("rollout/gen_tokens") / seconds if seconds else None,
        "samples_per_step": mean("rollout/n_samples"),
        "gen_tokens_per_step": mean("rollout/gen_tokens"),
        "fixed_lengths_ok": bool(measured) and all(r.get("rollout/gen_tokens") == expected_tokens for r in measured),
        "step_s": [r.get("timing/step_s") for r in steps],
        "step_s_mean": mean("timing/step_s"),
        "phase_s_mean": {p: mean(f"timing/{p}_s") for p in PHASES},
        # CPU seconds of the trainer's training thread and of its other threads (the rollout
        # client, in an async run) per phase: the GIL share the training thread gave up
        "phase_cpu_s_mean": {
            p: {"main": mean(f"cpu/{p}_main_s"), "others": mean(f"cpu/{p}_others_s")}
            for p in ("recompute_logprob", "train")
        },
        # the micro-batch token budgets the trainer used (with --max-tokens-per-mb auto: measured)
        "mb_token_budget_mean": {
            "train": mean("train/mb_token_budget"),
            "forward": mean("train/mb_token_budget_forward"),
        },
        "weight_update_s_mean": mean("weight_update/seconds"),
        # its parts (gather, transfer, ...) and, around it, pausing and resuming generation
        # (pause_s on the trainer, server_pause_s the server's own, requests_aborted,
        # requests_in_flight: what the servers ran or queued as the pause began, and drain_s with
        # requests_drained: the client's requests an abort-mode pause aborted and waited for)
        "weight_update_parts_mean": {key.removeprefix("weight_update/"): mean(key) for key in update_parts},
        # and each measured step's, in order: a mean hides whether one pause struck a timeout
        "weight_update_parts_by_step": {
            key.removeprefix("weight_update/"): [r.get(key) for r in measured] for key in update_parts
        },
        # the built-in server's work per step: prefills, decode steps, their seconds, the mean
        # decode batch and forward_frac (the share of the step it spent in forward passes)
        "server_mean": {
            key.removeprefix("server/"): mean(key)
            for key in sorted({k for r in measured for k in r if k.startswith("server/")})
        },
        # generated tokens over the trainer's seconds (logprob recompute + train), prompts not
        # counted: the pipeline's useful output per trainer second
        "train_gen_tokens_per_s": total("rollout/gen_tokens") / trainer_s if total("timing/train_s") else None,
        # all the tokens the trainer's passes run over (prompts and generated), bench_train's measure:
        # over the train phase alone, and over recompute + train
        "tokens_per_step": mean("rollout/tokens"),
        "train_tokens_per_s": total("rollout/tokens") / total("timing/train_s") if total("timing/train_s") else None,
        "trainer_tokens_per_s": total("rollout/tokens") / trainer_s if total("timing/train_s") else None,
        # the tokens rank 0's train passes computed (train/n_tokens, over the step's minibatches):
        # fewer than rollout/tokens with actor.share_prompts, each prompt once for its answers
        "train_computed_tokens_per_step": mean("train/n_tokens"),
        # colocated runs: the hand-off of a time-shared step (release, resume, the trainer's
        # offload) and each process's device memory at the hand-off points (max over steps)
        "handoff_mean": {
            key.removeprefix("handoff/"): mean(key)
            for key in sorted({k for r in measured for k in r if k.startswith("handoff/")})
        },
        "memory_gb_max": {
            key.removeprefix("memory/"): max(float(r[key]) for r in measured if key in r)
            for key in sorted({k for r in measured for k in r if k.startswith("memory/")})
        },
        "weight_update_bytes": mean("weight_update/bytes"),
        "staleness_max": max((r.get("rollout/staleness_max") or 0 for r in measured), default=None),
        "staleness_mean": mean("rollout/staleness_mean"),
        "mixed_version_frac": mean("rollout/mixed_version_frac"),
        # dynamic sampling: the share of groups dropped, and the samples generated beyond each batch
        "dropped_groups_frac": mean("rollout/dropped_groups_frac"),
        "extra_samples_per_step": mean("rollout/extra_samples"),
        "startup_s": (step_arrivals[0] - start - float(steps[0].get("timing/step_s") or 0)) if steps else None,
        "gpu": None,
    }
    # the measured window: from the end of the last warm-up step to the end of the last step
    t0 = t1 = None
    if measured:
        t0 = (
            step_arrivals[args.warmup - 1]
            if args.warmup
            else step_arrivals[0] - float(steps[0].get("timing/step_s") or 0)
        )
        t1 = step_arrivals[-1]
    # the measured seconds from arrival times of metrics rows (0.2 s resolution): a cross-check
    out["measured_wall_s"] = t1 - t0 if t0 is not None else None
    roles = roles or gpu_roles(args.servers, args.trainer_backend[0], args.colocate)
    n_trainers = sum(role.startswith("trainer-") for role in roles)
    out["train_mfu"] = train_mfu(args, out, n_trainers=n_trainers)
    out["train_mfu_computed"] = train_mfu_computed(out, n_trainers)
    if sampler is not None:
        out["gpu"] = {role: sampler.summary(i, t0, t1) for role, i in roles.items()}
        out["gpu"]["source"] = sampler.source
    return out


def train_mfu(args, mode: dict, n_trainers: int) -> float | None:
    """The train phase's model FLOP/s per trainer GPU over --peak-tflops, counted as bench_train
    counts them (scripts/model_shapes.py: flops_per_token at the batch's mean sequence length):
    comparable with bench_train's MFU. None on CPU or without the token counts."""
    from types import SimpleNamespace

    from model_shapes import SHAPES, flops_per_token

    rate, tokens, samples = mode.get("train_tokens_per_s"), mode.get("tokens_per_step"), mode.get("samples_per_step")
    if args.device != "cuda" or not (rate and tokens and samples and n_trainers):
        return None
    per_token = flops_per_token(SimpleNamespace(**SHAPES[args.shape]), tokens / samples)
    return per_token * rate / n_trainers / (args.peak_tflops * 1e12)


def train_mfu_computed(mode: dict, n_trainers: int) -> float | None:
    """train_mfu over the tokens the trainers computed (rank 0's count, times the trainers): below
    train_mfu with actor.share_prompts, which computes each prompt once for its answers."""
    mfu, tokens = mode.get("train_mfu"), mode.get("tokens_per_step")
    computed = mode.get("train_computed_tokens_per_step")
    if not (mfu and computed and tokens):
        return None
    return mfu * min(1.0, computed * n_trainers / tokens)


def zip_steps(steps: list[dict], arrivals: list[float]):
    """(row, arrival) of training steps only; `arrivals` holds one time per metrics row (step 0 too)."""
    return [(r, t) for r, t in zip(steps, arrivals[len(arrivals) - len(steps) :])]


# ---- the whole benchmark --------------------------------------------------------------------------


def hardware(device: str) -> dict:
    import torch
    import transformers

    info = {
        "device": device,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "gpus": None,
    }
    try:
        import importlib.metadata as md

        info["sglang"] = md.version("sglang")
    except Exception:
        info["sglang"] = None
    if device == "cuda":
        from areal.infra.host import query_gpus

        info["gpus"] = query_gpus("index,name,memory.total,driver_version") or "nvidia-smi failed or missing"
    return info


def balance(modes: dict) -> dict | None:
    """Phase times of the synchronous run and the async speedup they allow."""
    sync = modes.get("sync")
    if not sync or not sync.get("measured_steps"):
        return None
    ph = sync["phase_s_mean"]
    gen = ph.get("rollout") or 0.0
    train = sum(ph.get(p) or 0.0 for p in ("advantages", "recompute_logprob", "train"))
    other = (sync.get("step_s_mean") or 0.0) - gen - train
    ceiling = (gen + train + other) / (max(gen, train) + other) if max(gen, train) + other > 0 else None
    return {
        "sync_generation_s": gen,
        "sync_training_s": train,
        "sync_other_s": other,
        "generation_over_training": gen / train if train else None,
        "async_ceiling": ceiling,
    }


def async_losses(modes: dict) -> dict:
    """Per async mode, the seconds per step that separate it from the ceiling: its step against
    the sync run's longer phase (`over_ceiling_s`), split into training slower than in sync
    (`train_s`: the rollout client shares the trainer's GIL), waiting for rollouts (`rollout_wait_s`:
    generation did not keep up) and the weight update's extra time (`weight_update_s`)."""
    sync = modes.get("sync")
    if not sync or not sync.get("measured_steps"):
        return {}
    sph = sync["phase_s_mean"]

    def training(ph):
        return sum(ph.get(p) or 0.0 for p in ("advantages", "recompute_logprob", "train"))

    floor = max(sph.get("rollout") or 0.0, training(sph)) + (sph.get("weight_update") or 0.0)
    out = {}
    for name, m in modes.items():
        if name == "sync" or not m.get("measured_steps"):
            continue
        ph = m["phase_s_mean"]
        out[name] = {
            "over_ceiling_s": (m.get("step_s_mean") or 0.0) - floor,
            "train_s": training(ph) - training(sph),
            "rollout_wait_s": ph.get("rollout") or 0.0,
            "weight_update_s": (ph.get("weight_update") or 0.0) - (sph.get("weight_update") or 0.0),
        }
    return out


def write(path: str, result: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, path)


def _terminated(signum, _frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return bench(args)
    previous = signal.signal(signal.SIGTERM, _terminated)  # run_mode then stops the launcher it started
    try:
        return bench(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def bench(args) -> int:
    args.device = resolve_device(args)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.run_timeout = args.run_timeout or (270.0 if args.device == "cuda" else 300.0)
    args.budget = args.budget or (480.0 if args.device == "cuda" else float("inf"))
    if args.device == "cuda":
        check_cuda_layout(args)
    data = resolve_data(args.data)
    workdir = Path(args.workdir).expanduser().resolve()  # the runs' cwd is the repository
    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    say(
        f"bench_e2e: {args.shape} on {args.device} ({args.dtype}), {args.batch_size} prompts x "
        f"{args.n_samples} samples x {args.max_new_tokens} new tokens per step, offpolicyness "
        f"{args.offpolicyness}, {args.servers} server(s), trainer {' '.join(args.trainer_backend)}, data {data}"
    )
    model_dir, tok_dir = build_model(args, workdir)
    config = {k: (None if v == float("inf") else v) for k, v in vars(args).items()}
    config.update(
        data=data,
        model_dir=model_dir,
        tokenizer_dir=tok_dir,
        overrides_example=overrides(args, 0, 0, model_dir, tok_dir, data, workdir / "runs"),
    )
    result = {
        "benchmark": "bench_e2e",
        "goal_speedup": GOAL_SPEEDUP,
        "config": config,
        "hardware": hardware(args.device),
        "layouts": {},
        "modes": {},
        "speedup": {},
        "balance": None,
        "goal_met": None,
    }
    runs = [(backend, variant, k) for backend, variant in run_sets(args) for k in args.offpolicyness]
    for index, (backend, variant, k) in enumerate(runs):
        timeout, warning = mode_time_limit(
            args.run_timeout, args.budget, time.time() - t_start, later=len(runs) - index - 1
        )
        if warning:
            say(warning)
        layout = result["layouts"].setdefault(
            set_key(backend, variant),
            {
                "backend": backend,
                "variant": variant,
                "variant_overrides": args.variants.get(variant, []),
                "gpus": gpu_roles(args.servers, backend, args.colocate),
                "modes": {},
                "speedup": {},
                "balance": None,
                "goal_met": None,
            },
        )
        layout["modes"][mode_name(k)] = run_mode(
            args, k, index, model_dir, tok_dir, data, workdir, timeout=timeout, backend=backend, variant=variant
        )
        finish(layout)
        first = next(iter(result["layouts"].values()))  # the top level: the first layout's (and variant's)
        result.update(
            {
                key: first.get(key)
                for key in ("modes", "speedup", "balance", "async_losses", "stopped_early", "goal_met")
            }
        )
        if args.variants:
            result["variants"] = compare_variants(result["layouts"])
        write(args.out, result)
        if k == 0:
            say_balance(layout["balance"])
    result["total_s"] = time.time() - t_start
    write(args.out, result)
    report(result)
    return 0 if all(m["status"] == "ok" for lay in result["layouts"].values() for m in lay["modes"].values()) else 1


def mode_time_limit(run_timeout: float, budget: float, elapsed: float, later: int) -> tuple[float, str | None]:
    """Seconds this mode may run (at least 60), keeping RESERVE_S for each of the `later` modes
    within --budget; and a warning when that cuts it below --run-timeout (a mode cut that way may
    measure only one step)."""
    limit = max(min(run_timeout, budget - elapsed - RESERVE_S * later), 60.0)
    if limit >= run_timeout:
        return limit, None
    return limit, (
        f"warning: --budget {budget:.0f} s leaves this mode {limit:.0f} s of its --run-timeout "
        f"{run_timeout:.0f} s ({elapsed:.0f} s spent, {RESERVE_S:.0f} s kept for each of "
        f"{later} later mode(s)); it may stop before its measured steps: raise --budget"
    )


def finish(result: dict) -> None:
    modes = result["modes"]
    base = (modes.get("sync") or {}).get("samples_per_s")
    result["speedup"] = {
        f"{name}_vs_sync": (m["samples_per_s"] / base if base and m.get("samples_per_s") else None)
        for name, m in modes.items()
        if name != "sync"
    }
    result["balance"] = balance(modes)
    result["async_losses"] = async_losses(modes)
    ups = [v for v in result["speedup"].values() if v is not None]
    # a mode that stopped early measured fewer steps than asked: its speedup is a hint, no verdict
    result["stopped_early"] = [name for name, m in modes.items() if m.get("status") != "ok"]
    result["goal_met"] = (max(ups) >= GOAL_SPEEDUP) if ups and not result["stopped_early"] else None


def compare_variants(layouts: dict) -> list[dict]:
    """One row per layout, variant and mode: samples/s and trainer tokens/s (generated tokens over
    recompute + train seconds), each also as a ratio to the layout's first variant in the same mode.
    Ratios compare completed runs only: a run that stopped early (a retract run out of memory after
    one step showed 1.37x, 2026-12-07) keeps its figures, marked by its status, but no ratio."""

    def ratio(m, ref, key):
        x, ref_x = m.get(key), ref.get(key)
        ok = m.get("status") == ref.get("status") == "ok"
        return x / ref_x if ok and isinstance(x, (int, float)) and isinstance(ref_x, (int, float)) and ref_x else None

    rows, reference = [], {}
    for lay in layouts.values():
        for mode, m in lay["modes"].items():
            ref = reference.setdefault((lay["backend"], mode), m)
            ph = m.get("phase_s_mean") or {}
            rows.append(
                {
                    "layout": lay["backend"],
                    "variant": lay["variant"],
                    "overrides": lay["variant_overrides"],
                    "mode": mode,
                    "status": m.get("status"),
                    "samples_per_s": m.get("samples_per_s"),
                    "samples_per_s_vs_first": ratio(m, ref, "samples_per_s"),
                    "train_gen_tokens_per_s": m.get("train_gen_tokens_per_s"),
                    "train_tokens_per_s_vs_first": ratio(m, ref, "train_gen_tokens_per_s"),
                    "step_s_mean": m.get("step_s_mean"),
                    "phase_s_mean": {p: ph.get(p) for p in ("rollout", "recompute_logprob", "train", "weight_update")},
                    "startup_s": m.get("startup_s"),
                }
            )
    return rows


def busy(gpu: dict | None, role: str) -> float | None:
    """Mean busy fraction of the GPUs whose role starts with `role` (server / trainer)."""
    vals = [
        g["busy_fraction"]
        for name, g in (gpu or {}).items()
        if name.startswith(role + "-") and isinstance(g, dict) and g.get("busy_fraction") is not None
    ]
    return statistics.fmean(vals) if vals else None


def report(result: dict) -> None:
    def f(x, spec):
        return format(x, spec) if isinstance(x, (int, float)) else "-".rjust(int(spec.split(".")[0]))

    for key, layout in result["layouts"].items():
        overrides_text = " ".join(layout.get("variant_overrides") or [])
        say(
            f"\n== summary: trainer {key}, {result['config']['servers']} server(s)"
            + (f"; {overrides_text}" if overrides_text else "")
        )
        say(
            f"{'mode':<8} {'status':<8} {'samples/s':>10} {'gen tok/s':>10} {'step s':>8} {'rollout':>8} "
            f"{'train':>8} {'w-update':>8} {'trn tok/s':>9} {'all tok/s':>9} {'MFU':>6} {'cMFU':>6} {'srv busy':>8} "
            f"{'trn busy':>8}"
        )
        for name, m in layout["modes"].items():
            ph = m.get("phase_s_mean") or {}
            train = sum(ph.get(p) or 0.0 for p in ("advantages", "recompute_logprob", "train"))
            say(
                f"{name:<8} {m['status']:<8} {f(m.get('samples_per_s'), '10.2f')} "
                f"{f(m.get('gen_tokens_per_s'), '10.0f')} {f(m.get('step_s_mean'), '8.2f')} "
                f"{f(ph.get('rollout'), '8.2f')} {f(train, '8.2f')} {f(ph.get('weight_update'), '8.2f')} "
                f"{f(m.get('train_gen_tokens_per_s'), '9.0f')} {f(m.get('train_tokens_per_s'), '9.0f')} "
                f"{f(m.get('train_mfu'), '6.3f')} {f(m.get('train_mfu_computed'), '6.3f')} "
                f"{f(busy(m.get('gpu'), 'server'), '8.0%')} "
                f"{f(busy(m.get('gpu'), 'trainer'), '8.0%')}"
            )
        early = layout.get("stopped_early") or []
        partial = f"; from runs that stopped early: {', '.join(early)}" if early else ""
        for key, value in layout["speedup"].items():
            say(f"speedup {key}: {value:.2f}x (goal {GOAL_SPEEDUP}x{partial})" if value else f"speedup {key}: -")
        say_balance(layout["balance"])
        for name, loss in (layout.get("async_losses") or {}).items():
            say(
                f"{name} over the ceiling: {loss['over_ceiling_s']:+.2f} s per step = training slower than "
                f"sync {loss['train_s']:+.2f} s, waiting for rollouts {loss['rollout_wait_s']:.2f} s, "
                f"weight update {loss['weight_update_s']:+.2f} s (and the rest)"
            )
    if result.get("variants"):
        say("\n== variants (ratios to the first variant of each layout, same mode)")
        say(
            f"{'layout/variant':<24} {'mode':<8} {'status':<8} {'samples/s':>10} {'x first':>8} {'trn tok/s':>10} "
            f"{'x first':>8} {'step s':>7} {'recomp':>7} {'train':>7} {'start s':>7}"
        )
        for r in result["variants"]:
            ph = r["phase_s_mean"]
            say(
                f"{set_key(r['layout'], r['variant']):<24} {r['mode']:<8} {r['status'] or '-':<8} "
                f"{f(r['samples_per_s'], '10.2f')} {f(r['samples_per_s_vs_first'], '8.3f')} "
                f"{f(r['train_gen_tokens_per_s'], '10.0f')} {f(r['train_tokens_per_s_vs_first'], '8.3f')} "
                f"{f(r['step_s_mean'], '7.2f')} {f(ph.get('recompute_logprob'), '7.2f')} "
                f"{f(ph.get('train'), '7.2f')} {f(r['startup_s'], '7.0f')}"
            )
    say(f"total {result.get('total_s', 0):.0f} s")


def say_balance(b: dict | None) -> None:
    if not b:
        return
    say(
        f"balance (sync run, per step): generation {b['sync_generation_s']:.2f} s, training "
        f"{b['sync_training_s']:.2f} s, weight update and the rest {b['sync_other_s']:.2f} s -> "
        f"async can reach at most {b['async_ceiling']:.2f}x with these settings"
    )
    ratio = b["generation_over_training"]
    if ratio and not 0.8 <= ratio <= 1.25:
        if ratio > 1:
            say(
                "hint: generation dominates. A decode step costs about the same for more sequences while "
                "training grows with them: raise --n-samples or --batch-size (with --max-running-requests "
                "following), keep --grad-ckpt, or shorten --max-new-tokens (prompts then weigh more in training)"
            )
        else:
            say(
                "hint: training dominates: --no-grad-ckpt, fewer sequences (--batch-size, --n-samples), "
                "or longer --max-new-tokens"
            )


if __name__ == "__main__":
    sys.exit(main())
