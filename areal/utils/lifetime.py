"""A spawned helper process that ends with the process that started it.

A worker that blocks on a pipe or queue whose other end its parent holds would wait for ever, and
be reparented to init, when the parent dies without shutting it down (a trainer rank SIGKILLed, or
the launcher above it). The parent's sentinel, a pipe that closes however the parent exits, wakes
a daemon thread here, which ends the process. Unlike PR_SET_PDEATHSIG it does not depend on which
of the parent's threads started the worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading


def exit_with_parent() -> None:
    """Call first thing in a multiprocessing child: it exits (code 1) once its parent is gone."""
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:  # not a multiprocessing child: nothing to watch
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def exit_now(code: int) -> None:
    """End the process with `code` once its logs and streams are flushed, skipping the
    interpreter's teardown. For a process that has already closed what matters in order: tearing
    down torch's and transformers' modules held a built-in server 1.1-1.3 s after its last request
    on 2 cores, a wait that every run's stop shares."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
