"""Entry point of the built-in inference server:

    python -m areal.server --model-path /path/to/hf_model --port 30000 [--dtype float32] ...

Loads the model, starts the scheduler thread and the HTTP server, prints one line when it is
ready ("The server is fired up and ready to roll!", as SGLang does), and serves until SIGTERM or
SIGINT, then shuts down cleanly (exit 0). Flag errors exit with status 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys

# Before torch loads: the decode step's temporaries (attention's repeated keys/values) grow by
# one column per step; expandable segments let the CUDA allocator reuse their memory instead of
# caching a new block per size until the GPU is full. A user's own setting wins.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from areal.infra.log_format import setup_process_logging
from areal.server.args import ServerArgs, parse_args

logger = logging.getLogger("areal.server")


def build_state(args: ServerArgs):
    """Load model and tokenizer, start the scheduler; returns the handlers' shared state."""
    from areal.server.engine import ModelRunner
    from areal.server.memory import MemoryOccupation, WeightOffloader
    from areal.server.scheduler import Scheduler
    from areal.server.state import ServerState
    from areal.server.weights import WeightUpdater

    args = _with_resolved_paths(args)
    runner = ModelRunner(args.model_path, args.dtype, args.device, args.random_seed)
    eos_ids = runner.eos_token_ids()
    tokenizer = _load_tokenizer(args, eos_ids)
    decode = None if tokenizer is None else (lambda ids: tokenizer.decode(ids))
    context = args.context_length or _model_context_length(runner.config)
    budget = _kv_budget(args, runner, context)
    scheduler = Scheduler(
        runner,
        max_running=args.max_running_requests,
        max_prefill_tokens=args.max_prefill_tokens,
        decode=decode,
        max_total_tokens=budget.max_total_num_tokens,
    )
    offloader = WeightOffloader(runner)
    return ServerState(
        args=args,
        runner=runner,
        tokenizer=tokenizer,
        scheduler=scheduler,
        updater=WeightUpdater(runner, offloader),
        context_length=context,
        weight_version=args.weight_version,
        eos_ids=eos_ids,
        weight_roots=_weight_roots(args),
        memory=MemoryOccupation(scheduler, offloader),
        kv_budget=budget,
    )


def _with_resolved_paths(args: ServerArgs) -> ServerArgs:
    """`tiny:<preset>` names a model the project builds locally (CPU demo, tests): its folder."""
    from areal.models.resolve import resolve_model_path

    return dataclasses.replace(
        args,
        model_path=resolve_model_path(args.model_path),
        tokenizer_path=args.tokenizer_path and resolve_model_path(args.tokenizer_path),
    )


def _load_tokenizer(args: ServerArgs, eos_ids: set[int]):
    """The tokenizer (None with --skip-tokenizer-init); its EOS joins `eos_ids`."""
    if args.skip_tokenizer_init:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)
    if tokenizer.eos_token_id is not None:
        eos_ids.add(int(tokenizer.eos_token_id))
    return tokenizer


def _kv_budget(args: ServerArgs, runner, context: int):
    """Plan the KV cache budget from --mem-fraction-static / --max-total-tokens, cap this
    process at its memory share, and log how the budget was reached."""
    from areal.server.memory import cap_process_memory, plan_kv_budget

    budget = plan_kv_budget(
        runner,
        mem_fraction=args.mem_fraction_static,
        max_total_tokens=args.max_total_tokens,
        max_prefill_tokens=args.max_prefill_tokens,
        context_length=context,
        max_running=args.max_running_requests,
    )
    cap_process_memory(runner.device, budget.mem_fraction_static)
    logger.info(
        "KV cache budget: %d tokens (%s; %d bytes per token, weights %.2f GiB, headroom %.2f GiB, %s x %.2f GiB)",
        budget.max_total_num_tokens,
        budget.limited_by,
        budget.bytes_per_token,
        budget.weights_bytes / 2**30,
        budget.headroom_bytes / 2**30,
        budget.mem_fraction_static,
        budget.device_total_bytes / 2**30,
    )
    if budget.max_total_num_tokens < context:
        logger.warning(
            "the KV budget (%d tokens) is below the context length (%d): longer requests are refused",
            budget.max_total_num_tokens,
            context,
        )
    return budget


def _weight_roots(args: ServerArgs) -> list[str]:
    """The folders /update_weights_from_disk may load from (weights.weight_roots), logged."""
    from areal.server.weights import weight_roots

    roots = weight_roots(args.model_path, args.weight_dirs)
    logger.info(
        "/update_weights_from_disk may load from %s%s",
        roots,
        "" if args.weight_dirs else " (no --weight-dirs: the model's folder and the default run root)",
    )
    return roots


def _model_context_length(config) -> int:
    text_config = config.get_text_config(decoder=True)
    value = getattr(text_config, "max_position_embeddings", None)
    if not value:
        raise ValueError("The model config has no max_position_embeddings; pass --context-length.")
    return int(value)


async def serve(args: ServerArgs) -> None:
    from aiohttp import web

    from areal.infra.sockets import listen_backlog, open_files_needed, raise_open_file_limit
    from areal.server.app import build_app
    from areal.server.connections import AcceptGuard

    # every request it takes (running or queued) may arrive on a connection of its own, at once
    concurrency = args.max_running_requests + args.max_queued_requests
    keys = "--max-running-requests + --max-queued-requests"
    raise_open_file_limit(open_files_needed(concurrency), what="areal.server", keys=keys)
    state = build_state(args)
    state.scheduler.start()
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    state.open_connections = lambda: len(runner.server.connections)  # connections.py
    backlog = listen_backlog(concurrency, what="areal.server", keys=keys)

    # out of open files while accepting: back-pressure and one warning naming the limit (connections.py)
    def count_accept_error() -> None:
        state.accept_out_of_files += 1

    asyncio.get_running_loop().set_exception_handler(AcceptGuard(backlog, on_error=count_accept_error))
    site = web.TCPSite(runner, args.host, args.port, shutdown_timeout=5.0, backlog=backlog)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"The server is fired up and ready to roll! areal.server on "
        f"http://{args.host}:{args.port} (model {args.model_path}, device "
        f"{state.runner.device}, dtype {state.runner.dtype})",
        flush=True,
    )
    await stop.wait()
    logger.info("shutting down")
    # Answer in-flight requests (finish reason abort) before the HTTP side closes.
    state.scheduler.abort(None, "Server shutting down.").result(timeout=30)
    await runner.cleanup()
    state.scheduler.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_process_logging(args.log_level.upper())
    # every weight update reloads the model: a progress bar per update would flood the run's log
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from areal.infra.sockets import OpenFileLimitError
    from areal.server.engine import ModelLoadError
    from areal.server.memory import MemoryBudgetError

    try:
        asyncio.run(serve(args))
    except (ModelLoadError, MemoryBudgetError, OpenFileLimitError) as exc:
        print(f"areal.server: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the port is taken
        print(f"areal.server: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    code = main()  # serve() answered every request and stopped the scheduler before it returned
    from areal.utils.lifetime import exit_now

    exit_now(code)
