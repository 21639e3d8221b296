"""A ProcessHost whose Ray worker dies before the actor runs, as a worker that segfaults at start.

tests/launcher/test_ray.py puts it in launcher.ray's place. The test writes a ticket naming the
process and how often: "trainer-1 once" kills the first worker that starts trainer-1's actor,
"trainer-1 always" every one. Ray imports this class by reference on its workers, so the ticket is
a file: the workers do not share the test's memory.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from launcher.ray import ProcessHost

TICKET = Path(tempfile.gettempdir()) / f"areal-crash-host-ticket-{os.getuid()}"


class CrashingHost(ProcessHost):
    def __init__(self, name: str):
        if _claims_ticket(name):
            os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(name)


def _claims_ticket(name: str) -> bool:
    try:
        target, how = TICKET.read_text().split()
    except (FileNotFoundError, ValueError):
        return False
    if target != name:
        return False
    if how == "always":
        return True
    try:
        TICKET.unlink()  # once: only one worker gets to unlink it
    except FileNotFoundError:
        return False
    return True
