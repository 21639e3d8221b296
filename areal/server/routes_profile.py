"""Profiling routes of the built-in server: SGLang's /start_profile and /stop_profile (GET or
POST), recording the model's torch ops with torch.profiler and writing a Chrome trace.

    POST /start_profile {"output_dir": "/tmp/prof", "profile_prefix": "run1"}   -> "Start profiling.\\n"
    ... /generate requests ...
    POST /stop_profile   -> "Stop profiling. This will take some time.\\n", once the trace
                            /tmp/prof/run1-<profile_id>-TP-0.trace.json.gz is written

As SGLang: the body is optional (empty, or a GET, means the defaults); output_dir defaults to
$SGLANG_TORCH_PROFILER_DIR or /tmp, profile_id to str(time.time()), activities to CPU and GPU,
with_stack and record_shapes to true. The trace file is
`{output_dir}/{profile_prefix}-{profile_id}-TP-0.trace.json.gz` (without `{profile_prefix}-`
when no prefix is given): this server is tensor-parallel rank 0 of 1. A second start while a
profile runs, and a stop without one, are a 400 with SGLang's message.

The profiler is started and stopped on the scheduler's worker thread, between steps, because
torch.profiler records the ops of the thread that starts it (the model runs there, not on the
event loop); writing the trace runs in an executor thread, so the worker goes back to generating
meanwhile. Stopping and saving are torch C++ calls that hold the GIL throughout (seconds for a
profile of thousands of steps with stacks and shapes): the event loop, /health included, answers
before and after them but not during them. SGLang's HTTP server runs in another process than its
scheduler, so its /health does not see that pause; keep profiles short, or send with_stack and
record_shapes false, which makes both calls several times faster.
"GPU" adds CUDA kernels when CUDA is available; on a CPU-only server it records the CPU ops.

Not supported here (a 400 naming the field): start_step and num_steps (SGLang's profile of a
given range of forward steps: the scheduler has no per-step hook to stop at an exact step, so
omit them and call /stop_profile), profile_by_stage and profile_stages (one trace per prefill and
decode stage), merge_profiles (there is one rank, nothing to merge), and the MEM and RPD
activities (CUDA memory snapshots, ROCm's RPD tracer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from areal.server.bodies import error, read_json
from areal.server.state import Routes, ServerState
from areal.server.validation import BadRequest, check_keys, get_typed
from areal.utils.traces import export_chrome_trace_gz

logger = logging.getLogger("areal.server")

START, STOP = "/start_profile", "/stop_profile"
ACTIVITIES = ("CPU", "GPU", "MEM", "RPD")  # SGLang's choices
RECORDED_ACTIVITIES = ("CPU", "GPU")  # what this server records
TP_RANK = 0  # this server is tensor-parallel rank 0 of 1 (file names carry the rank)
# ProfileReqInput's fields (rid: SGLang's BaseReq, accepted and ignored as by the other routes)
START_KEYS = {
    "output_dir",
    "start_step",
    "num_steps",
    "activities",
    "profile_by_stage",
    "with_stack",
    "record_shapes",
    "profile_id",
    "merge_profiles",
    "profile_prefix",
    "profile_stages",
    "rid",
}
ALREADY_RUNNING = "Profiling is already in progress. Call /stop_profile first."
NOT_RUNNING = "Profiling is not in progress. Call /start_profile first."


@dataclass
class ProfileRequest:
    """A validated /start_profile body, defaults filled in as SGLang fills them."""

    output_dir: Path
    profile_id: str
    profile_prefix: str
    activities: list[str]
    with_stack: bool
    record_shapes: bool

    @property
    def trace_path(self) -> Path:
        """SGLang's name: `{prefix}-{profile_id}-TP-{rank}.trace.json.gz` (no `-` without a prefix)."""
        prefix = f"{self.profile_prefix}-" if self.profile_prefix else ""
        return self.output_dir / f"{prefix}{self.profile_id}-TP-{TP_RANK}.trace.json.gz"


def parse_start_profile(body: dict) -> ProfileRequest:
    """Validate a /start_profile body (unknown keys, wrong types and the fields this server does
    not implement are a BadRequest naming the key)."""
    check_keys(body, START_KEYS, START)
    for key in ("start_step", "num_steps"):
        value = get_typed(body, key, int, None, START)
        if value:  # SGLang treats 0 as unset too
            raise BadRequest(
                f"{START}: '{key}'={value!r} is not supported by the built-in server (it cannot "
                "stop at a given forward step); omit it and call /stop_profile to end the profile."
            )
    for key in ("profile_by_stage", "merge_profiles"):
        if get_typed(body, key, bool, False, START):
            raise BadRequest(
                f"{START}: '{key}'=true is not supported by the built-in server (one rank, one "
                "trace for all stages); omit it (or send false) and call /stop_profile to end the profile."
            )
    if body.get("profile_stages") is not None:
        raise BadRequest(
            f"{START}: 'profile_stages' is not supported by the built-in server (no per-stage "
            "profiles); omit it and call /stop_profile to end the profile."
        )
    activities = body.get("activities")
    if activities is None:
        activities = list(RECORDED_ACTIVITIES)
    if not isinstance(activities, list) or not activities or not all(isinstance(a, str) for a in activities):
        raise BadRequest(
            f"{START}: 'activities' must be null or a non-empty list of strings from "
            f"{list(ACTIVITIES)}, got {activities!r}."
        )
    unknown = [a for a in activities if a not in ACTIVITIES]
    if unknown:
        raise BadRequest(f"{START}: unknown activities {unknown}; choose from {list(RECORDED_ACTIVITIES)}.")
    unsupported = [a for a in activities if a not in RECORDED_ACTIVITIES]
    if unsupported:
        raise BadRequest(
            f"{START}: activities {unsupported} are not supported by the built-in server (it records "
            f"torch ops: {list(RECORDED_ACTIVITIES)}); omit them and call /stop_profile to end the profile."
        )
    output_dir = get_typed(body, "output_dir", str, None, START)
    if output_dir is None:  # read per request, as SGLang does
        output_dir = os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
    if not output_dir:
        raise BadRequest(f"{START}: 'output_dir' is empty; omit it for the default, or name a folder.")
    profile_id = get_typed(body, "profile_id", str, None, START)
    profile_id = str(time.time()) if profile_id is None else profile_id
    prefix = get_typed(body, "profile_prefix", str, None, START) or ""
    for key, value in (("profile_id", profile_id), ("profile_prefix", prefix)):
        if "/" in value or "\0" in value or (key == "profile_id" and not value):
            raise BadRequest(
                f"{START}: '{key}' {value!r} must be {'a non-empty' if key == 'profile_id' else 'a'} part "
                "of a file name (no '/'); use 'output_dir' to choose the folder."
            )
    return ProfileRequest(
        output_dir=Path(output_dir).expanduser(),
        profile_id=profile_id,
        profile_prefix=prefix,
        activities=list(dict.fromkeys(activities)),
        # SGLang's tokenizer manager: true unless sent false
        with_stack=get_typed(body, "with_stack", bool, True, START),
        record_shapes=get_typed(body, "record_shapes", bool, True, START),
    )


def _torch_activities(requested: list[str]) -> list:
    import torch
    from torch.profiler import ProfilerActivity

    chosen = []
    if "CPU" in requested:
        chosen.append(ProfilerActivity.CPU)
    if "GPU" in requested:
        if torch.cuda.is_available():
            chosen.append(ProfilerActivity.CUDA)
        elif not chosen:  # a GPU-only profile of a CPU server: its "kernels" are the CPU ops
            logger.info("%s: no CUDA device, so activity GPU records the CPU ops", START)
            chosen.append(ProfilerActivity.CPU)
    return chosen


class ProfileRoutes(Routes):
    """One profile at a time; start and stop take turns (a start sent while a stop writes its
    trace waits for it, as SGLang's scheduler handles them one after the other)."""

    def __init__(self, state: ServerState):
        super().__init__(state)
        self._lock = asyncio.Lock()
        self._profiler = None  # torch.profiler.profile while a profile runs
        self._request: ProfileRequest | None = None

    async def start_profile(self, request: web.Request) -> web.Response:
        req = parse_start_profile(await read_json(request, allow_empty=True))
        async with self._lock:
            if self._profiler is not None:
                return error(400, ALREADY_RUNNING)
            try:  # fail now rather than lose the profile at /stop_profile
                req.output_dir.mkdir(parents=True, exist_ok=True)
                if not os.access(req.output_dir, os.W_OK | os.X_OK):
                    raise PermissionError("not writable")
            except OSError as exc:
                raise BadRequest(f"{START}: cannot write traces to output_dir {str(req.output_dir)!r}: {exc}.")
            from torch.profiler import profile

            profiler = profile(
                activities=_torch_activities(req.activities),
                with_stack=req.with_stack,
                record_shapes=req.record_shapes,
            )
            # on the worker thread: the profiler records the thread that starts it
            await asyncio.wrap_future(self.s.scheduler.call(profiler.start))
            self._profiler, self._request = profiler, req
            logger.info("Profiling starts. The trace will be saved to %s", req.trace_path)
        return web.Response(text="Start profiling.\n", status=200)

    async def stop_profile(self, request: web.Request) -> web.Response:
        check_keys(await read_json(request, allow_empty=True), {"rid"}, STOP)
        async with self._lock:
            profiler, req = self._profiler, self._request
            if profiler is None:
                return error(400, NOT_RUNNING)
            self._profiler = self._request = None
            t0 = time.perf_counter()
            await asyncio.wrap_future(self.s.scheduler.call(profiler.stop))
            path = req.trace_path
            try:  # off the worker (generation goes on) and off the event loop
                await asyncio.get_running_loop().run_in_executor(None, export_chrome_trace_gz, profiler, path)
            except OSError as exc:
                return error(500, f"{STOP}: the profile stopped, but writing its trace to {str(path)!r} failed: {exc}")
            logger.info("Profiling done in %.1f s. The trace is saved to %s", time.perf_counter() - t0, path)
        return web.Response(text="Stop profiling. This will take some time.\n", status=200)
