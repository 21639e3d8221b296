"""torch.profiler traces of the training steps named in profiler.steps.

Each trainer rank traces the whole step (rollout wait, recompute, train, weight update, save,
evaluation) into RUN/profile/trainer-rank{r}-step{n}.trace.json.gz, with the phases marked as
`areal/phase/<name>` annotations and the step as `areal/step`, so that
`scripts/trace_summary.py` can say where the time went phase by phase. With profiler.servers,
rank 0 asks the inference servers (SGLang's /start_profile and /stop_profile) to trace the same
window into RUN/profile/server-{i}/step{n}-TP-{rank}.trace.json.gz.

A traced step is slower than the others (the profiler's own cost, and the export after it), and
its row in metrics.jsonl says so (`profiler/traced` = 1). A server that cannot be traced costs the
run nothing but a warning: the trainer's trace is still written.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

from areal.utils.traces import export_chrome_trace_gz

logger = logging.getLogger(__name__)

STEP_ANNOTATION = "areal/step"
PHASE_PREFIX = "areal/phase/"


def trainer_trace_path(run_dir: str | Path, rank: int, step: int) -> Path:
    return Path(run_dir) / "profile" / f"trainer-rank{rank}-step{step}.trace.json.gz"


def server_trace_dir(run_dir: str | Path, index: int) -> Path:
    return Path(run_dir) / "profile" / f"server-{index}"


class StepProfiler:
    """`with profiler.step(n) as traced:` traces step n when profiler.steps lists it; `traced`
    tells the step to mark its phases. `control` (rank 0's ServerControl, or None) reaches the
    servers."""

    def __init__(self, cfg, rank: int, control: Any | None = None):
        self.cfg, self.rank, self.control = cfg, rank, control
        self.steps = set(cfg.profiler.steps)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[bool]:
        if step not in self.steps:
            yield False
            return
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        p = self.cfg.profiler
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        servers = self._start_servers(step)
        try:
            with profile(activities=activities, record_shapes=p.record_shapes, with_stack=p.with_stack) as prof:
                with record_function(STEP_ANNOTATION):
                    yield True
        finally:
            if servers:
                self._stop_servers(step)
        path = trainer_trace_path(self.cfg.run_dir, self.rank, step)
        export_chrome_trace_gz(prof, path)
        logger.info("step %d traced: %s (python scripts/trace_summary.py %s)", step, path, path)

    def _start_servers(self, step: int) -> bool:
        if self.control is None or not self.cfg.profiler.servers:
            return False
        p = self.cfg.profiler
        try:
            self.control.start_profile(
                lambda i: str(server_trace_dir(self.cfg.run_dir, i)),
                f"step{step}",
                with_stack=p.with_stack,
                record_shapes=p.record_shapes,
            )
        except Exception as e:  # a trace is a diagnostic: the run goes on without the servers'
            logger.warning("profiler.servers: the servers do not trace step %d: %s", step, e)
            self._stop_servers(step, quiet=True)  # those that did start
            return False
        return True

    def _stop_servers(self, step: int, quiet: bool = False) -> None:
        try:
            self.control.stop_profile()
        except Exception as e:
            if not quiet:
                logger.warning("profiler.servers: the servers' traces of step %d were not written: %s", step, e)
            return
        if not quiet:
            logger.info("step %d: the servers' traces are under %s", step, server_trace_dir(self.cfg.run_dir, 0).parent)
