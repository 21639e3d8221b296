"""How long each trainer rank has been in its phase (launcher.trainer_phase_timeout_s).

Each rank overwrites RUN/logs/trainer-K.phase with "step N PHASE" as a phase starts
(areal/trainer/grpo.py Phases), so the file's age is the time the rank has spent in that phase.
The other deadlines miss a rank that blocks without being stopped when no peer waits for it in a
collective (a one-rank run: a deadlock, a hung device call); this one catches any rank whose
phase outlasts the slowest a phase may take.

The watch starts with the rank's first phase: a phase file older than the watch (left by an
earlier attempt of a recovered run) is not the rank's yet. Start-up (imports, the model's load, the
servers' warm-up) is not watched: it may take long on large models and slow storage, and a
multi-rank start-up that hangs ends at actor.collective_timeout_s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

CHECK_EVERY_S = 1.0  # the timeout is minutes or more: a 1 s delay is noise


@dataclass(frozen=True)
class PhaseAge:
    name: str  # trainer-K
    phase: str  # "step N PHASE"
    seconds: float
    started: float  # wall-clock time the phase began (the file's mtime)


def phase_stamps(logs_dir: str | Path, names: list[str]) -> dict[str, int | None]:
    """Each rank's phase file's modification time in ns (None where it has none yet)."""
    stamps: dict[str, int | None] = {}
    for name in names:
        try:
            stamps[name] = (Path(logs_dir) / f"{name}.phase").stat().st_mtime_ns
        except OSError:
            stamps[name] = None
    return stamps


def any_phase_since(logs_dir: str | Path, stamps: dict[str, int | None]) -> bool:
    """Whether any rank has entered a phase of a step (rewritten its phase file) since `stamps`
    were taken: until then the run is starting up. A changed time, not a later one, so a file
    server whose clock differs from this host's cannot hide the change."""
    return any(now is not None and now != stamps[name] for name, now in phase_stamps(logs_dir, list(stamps)).items())


class PhaseWatch:
    """Ages of the ranks' phases, read at most every CHECK_EVERY_S; `overdue` and `to_notice`
    say which ranks passed the timeout and which passed half of it (each phase noticed once)."""

    def __init__(self, logs_dir: str | Path, names: list[str], timeout_s: float, clock=time.time):
        self.logs_dir = Path(logs_dir)
        self.names = names
        self.timeout_s = timeout_s
        self.clock = clock
        self.since = clock()
        self.checked_at = float("-inf")
        self.noticed: set[tuple[str, float]] = set()

    def ages(self) -> list[PhaseAge]:
        """The phase of every watched rank that has entered one since the watch started, and how
        long it has been in it, the oldest first."""
        now = self.clock()
        out = []
        for name in self.names:
            path = self.logs_dir / f"{name}.phase"
            try:
                changed = path.stat().st_mtime
                phase = path.read_text().strip() if changed >= self.since else ""
            except OSError:
                continue
            if phase:
                out.append(PhaseAge(name, phase, now - changed, changed))
        return sorted(out, key=lambda a: -a.seconds)

    def due(self) -> bool:
        now = self.clock()
        if now - self.checked_at < CHECK_EVERY_S:
            return False
        self.checked_at = now
        return True

    def overdue(self, ages: list[PhaseAge]) -> PhaseAge | None:
        """The rank longest in its phase, if that is past the timeout."""
        return next((a for a in ages if a.seconds > self.timeout_s), None)

    def to_notice(self, ages: list[PhaseAge]) -> list[PhaseAge]:
        """Ranks past half the timeout in a phase not noticed before."""
        out = [a for a in ages if a.seconds > self.timeout_s / 2 and (a.name, a.started) not in self.noticed]
        self.noticed.update((a.name, a.started) for a in out)
        return out
