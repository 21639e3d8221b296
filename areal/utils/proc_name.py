"""The name a helper process shows in `ps`, `top` and the launcher's errors.

Spawned helpers (episode workers, reward workers) all run `python -c "from multiprocessing.spawn
import spawn_main; ..."`, so their command lines do not say what they are. Their kernel name
(/proc/PID/comm, at most 15 bytes) is set here instead: the launcher names a stopped process of a
trainer's tree by it (launcher/supervisor.py), and psutil's name() reads it.
"""

from __future__ import annotations

import ctypes
import ctypes.util

PR_SET_NAME = 15
COMM_BYTES = 15  # TASK_COMM_LEN - 1


def set_process_name(name: str) -> bool:
    """Set the calling thread's kernel name (the process's, from the main thread); False where the
    platform has no prctl (then nothing changes)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    return prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:COMM_BYTES]), 0, 0, 0) == 0
