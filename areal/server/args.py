"""Command-line flags of the built-in server, named as SGLang's `launch_server` names them.

The launcher starts either `python -m sglang.launch_server` or `python -m areal.server` with the
same flags, so the flags SGLang has and this server needs keep SGLang's spelling and meaning.
--mem-fraction-static and --max-total-tokens bound the weights plus KV cache as SGLang's memory
pool does (see memory.py); --enable-memory-saver is accepted, since release/resume of memory work
here either way. A flag we do not know is an error (argparse exits with status 2), because a
silently ignored typo wastes a run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_MAX_QUEUED = 1024
DEFAULT_MEM_FRACTION = 0.9  # memory.py reads it from here (this module stays free of torch)


def default_run_root() -> str:
    """cluster.fileroot's default: where runs with default settings write disk weight updates."""
    from areal.config.cluster import ClusterConfig

    return ClusterConfig.model_fields["fileroot"].default


@dataclass(frozen=True)
class ServerArgs:
    """Parsed flags; field names follow SGLang's `ServerArgs` where one exists."""

    model_path: str
    tokenizer_path: str | None
    host: str
    port: int
    dtype: str
    device: str
    tp_size: int
    mem_fraction_static: float | None
    max_total_tokens: int | None
    enable_memory_saver: bool
    context_length: int | None
    random_seed: int
    api_key: str | None
    log_level: str
    max_running_requests: int
    max_queued_requests: int
    max_prefill_tokens: int
    skip_tokenizer_init: bool
    weight_version: str
    weight_dirs: list[str] | None


def build_parser() -> argparse.ArgumentParser:
    """The flags, in SGLang's spelling; --help lists them in the order they are added here."""
    p = argparse.ArgumentParser(
        prog="python -m areal.server",
        description="Transformers-backed inference server speaking SGLang's HTTP API subset.",
        allow_abbrev=False,
    )
    _add_model_flags(p)
    _add_memory_flags(p)
    _add_serving_flags(p)
    return p


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """What to serve, where it listens, and on which device."""
    p.add_argument("--model-path", required=True, help="HF model folder (or hub id).")
    p.add_argument("--tokenizer-path", default=None, help="Defaults to --model-path.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="Weights and compute dtype; auto takes the checkpoint's dtype."
    )
    p.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda when available, else cpu."
    )
    p.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=1,
        help="Only 1: the built-in server runs the model on one device.",
    )


def _add_memory_flags(p: argparse.ArgumentParser) -> None:
    """How much memory the weights and the KV cache may take (memory.py), and the context."""
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="Share of the device's memory (GPU, or RAM on CPU) for the weights plus "
        "the KV cache, as in SGLang. On CUDA the process is capped at it, and "
        "requests are admitted only while their worst-case KV cache fits what "
        f"is left after the weights and an activation headroom. Default: "
        f"{DEFAULT_MEM_FRACTION}.",
    )
    p.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="Lower the KV cache budget to this many tokens (SGLang's flag, for "
        "development and debugging); the budget is otherwise computed from "
        "--mem-fraction-static. /get_server_info reports it as "
        "max_total_num_tokens.",
    )
    p.add_argument(
        "--enable-memory-saver",
        action="store_true",
        help="Accepted for SGLang compatibility: /release_memory_occupation and "
        "/resume_memory_occupation work on the built-in server with or without "
        "it (weights move to CPU memory, the KV cache is dropped).",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="Max prompt + completion tokens; defaults to the model's max_position_embeddings.",
    )


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    """Sampling seed, access, logging, batching limits, and where weight updates may come from."""
    p.add_argument("--random-seed", type=int, default=0, help="Seed of the sampling generator.")
    p.add_argument(
        "--api-key", default=None, help="When set, routes other than /health* need 'Authorization: Bearer KEY'."
    )
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument("--max-running-requests", type=int, default=64, help="Most sequences decoded together in one batch.")
    p.add_argument(
        "--max-queued-requests",
        type=int,
        default=DEFAULT_MAX_QUEUED,
        help="Most /generate requests waiting beyond the running batch (queued, or "
        "held while generation is paused); more are answered 503 at once, with a "
        "message, instead of piling up in memory (default: %(default)s).",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=16384,
        help="Most (padded) prompt tokens prefilled in one forward pass.",
    )
    p.add_argument(
        "--skip-tokenizer-init", action="store_true", help="Accept token ids only and return no text (as SGLang does)."
    )
    p.add_argument("--weight-version", default="default", help="Initial weight version reported in meta_info.")
    p.add_argument(
        "--weight-dirs",
        nargs="+",
        default=None,
        metavar="DIR",
        help="Folders /update_weights_from_disk may load from (after resolving '..' "
        "and symlinks), besides the model's own folder. Default: the default run "
        "root " + default_run_root() + ". '/' allows any path. The launcher passes "
        "the run's weight_update/, checkpoints/ and models/ folders.",
    )


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """Parse and check flags; a bad value exits with status 2 and names the flag and the fix."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.tp_size != 1:
        parser.error(
            f"--tp-size {ns.tp_size} is not supported by the built-in server: it runs "
            "the model on one device. Use --tp-size 1, or SGLang for tensor parallelism."
        )
    for flag, value, low in (
        ("--max-running-requests", ns.max_running_requests, 1),
        ("--max-queued-requests", ns.max_queued_requests, 0),
        ("--max-prefill-tokens", ns.max_prefill_tokens, 1),
        ("--max-total-tokens", ns.max_total_tokens, 1),
        ("--context-length", ns.context_length, 2),
    ):
        if value is not None and value < low:
            parser.error(f"{flag} {value} is invalid: use an integer >= {low}.")
    if ns.mem_fraction_static is not None and not 0 < ns.mem_fraction_static <= 1:
        parser.error(
            f"--mem-fraction-static {ns.mem_fraction_static} is invalid: use a share "
            "of the device's memory in (0, 1], e.g. 0.8."
        )
    if not 0 < ns.port < 65536:
        parser.error(f"--port {ns.port} is invalid: use 1..65535.")
    return ServerArgs(**vars(ns))
