"""The GIL switch interval of a process that runs the rollout client beside other Python threads.

The rollout executor's thread (HTTP answers, rewards, padding) shares a trainer's process with
the training thread, which launches torch ops; each op releases the GIL, and Python hands it
back only after the other thread has held it for the switch interval (5 ms by default). Process
entry points call this once at start (the trainer worker's rank 0 and the rollout driver, under
`rollout.gil_switch_interval_ms`); library classes leave the interpreter's settings alone.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)


def shorten_gil_switch_interval(ms: float | None) -> None:
    """Lower this process's GIL switch interval to `ms` (never raise it; None leaves it alone)."""
    if ms is None:
        return
    seconds = ms / 1000.0
    if seconds < sys.getswitchinterval():
        logger.info(
            "GIL switch interval %.3f ms -> %.3f ms (rollout.gil_switch_interval_ms)",
            sys.getswitchinterval() * 1000.0,
            ms,
        )
        sys.setswitchinterval(seconds)
