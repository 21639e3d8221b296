"""Recovery checkpoints: atomic, every N steps, resumable in a new process.

Layout under the run directory:
    checkpoints/step_00000012/         one complete checkpoint
        train_state/                   sharded fp32 weights + optimizer + LR schedule (DCP)
        rng/rank{r}.pt                 python, numpy, torch (and CUDA) RNG states of each rank
        trainer_state.json             step, epoch, dataloader position, weight version, extra
    checkpoints/latest                 name of the newest complete checkpoint

Atomicity: every rank writes into `step_N.tmp/`; after a barrier rank 0 writes
trainer_state.json last, fsyncs, renames the folder to `step_N` and then replaces `latest`
(write + fsync + os.replace). A crash at any point leaves either the old `latest` pointing at a
complete older checkpoint, or a `.tmp` folder that `load_latest` ignores (and the next save
removes). Only folders holding trainer_state.json count as checkpoints. A save that fails
(disk full, permissions) raises CheckpointWriteError naming the folder, the cause, the previous
checkpoint that stays usable, and the fix.

What the training loop must restore after `restore_checkpoint` (which already restores the
engine's weights, optimizer, schedule and RNG):
  * step and epoch: continue with step = state.step + 1;
  * dataloader position: skip state.dataloader_position batches of state.epoch (or load the
    sampler state you stored in state.extra), so no prompt is trained twice or skipped;
  * weight version: the loop owns it (TrainContext.version) and takes state.weight_version back.
    Servers restarted after the crash serve the initial weights, so push the restored weights as
    that version before rollouts resume (the push sets the rollout client's version too).
    Staleness is then counted from the restored version exactly as before the crash; rollouts
    that were in flight are lost and regenerated.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.json"
LATEST = "latest"


class CheckpointWriteError(RuntimeError):
    """A recovery checkpoint could not be written; the message names the folder and the fix."""


class CheckpointReadError(RuntimeError):
    """A recovery checkpoint is damaged (missing, truncated or garbled files); the message names
    the file or folder and the fix. Bytes changed inside tensor data are not detected: DCP shards
    carry no checksums."""


@dataclass
class TrainerState:
    """The training loop's position; everything else lives in the engine state."""

    step: int
    epoch: int = 0
    dataloader_position: int = 0
    weight_version: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def should_save(step: int, freq_steps: int | None) -> bool:
    """recover.freq_steps semantics: after every freq_steps-th step (steps count from 1)."""
    return bool(freq_steps) and step % freq_steps == 0


def save_checkpoint(engine, run_dir: str | Path, state: TrainerState, *, keep_last: int = 1) -> Path:
    """Write a complete checkpoint of engine + state (collective); returns its folder."""
    import torch.distributed as dist

    root = checkpoint_root(run_dir)
    final = root / f"step_{state.step:08d}"
    tmp = root / f"step_{state.step:08d}.tmp"
    if engine.is_rank0:
        with _writing(tmp, run_dir):
            if tmp.exists():
                shutil.rmtree(tmp)  # debris of a crash during an earlier save
            (tmp / "rng").mkdir(parents=True)
    dist.barrier()
    with _writing(tmp, run_dir):
        engine.save_train_state(str(tmp / "train_state"))
        torch.save(_rng_state(), tmp / "rng" / f"rank{dist.get_rank()}.pt")
        _fsync_tree(tmp / "rng")
    dist.barrier()
    if engine.is_rank0:
        with _writing(tmp, run_dir):
            _write_durably(tmp / STATE_FILE, json.dumps(asdict(state), indent=2))
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(root)
            _write_durably(root / LATEST, final.name)
        _prune(root, keep_last)
    dist.barrier()
    return final


@contextmanager
def _writing(folder: Path, run_dir: str | Path):
    """Turn a failed write into CheckpointWriteError (DCP wraps the writer's OSError in its own
    CheckpointException, a BaseException)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except (Exception, CheckpointException) as e:
        raise CheckpointWriteError(_write_failure(folder, run_dir, e)) from e


def _write_failure(folder: Path, run_dir: str | Path, error: BaseException) -> str:
    cause = _os_error_in(error)
    root = checkpoint_root(run_dir)
    try:
        found = load_latest(run_dir)
        previous = f"{found[0]} (step {found[1].step})" if found else "none (no checkpoint yet)"
    except Exception as e:  # a damaged older checkpoint must not hide this error
        previous = f"unknown ({e})"
    if cause is not None and cause.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = f"{cause.strerror or cause} ({cause.filename or folder})"
        fix = (
            f"free disk space where {root} lives (or point cluster.fileroot at a larger disk, or "
            "lower recover.keep_last)"
        )
    else:
        reason = str(cause) if cause is not None else f"{type(error).__name__}: {str(error)[:2000]}"
        fix = f"make sure {root} is writable"
    return (
        f"cannot write recovery checkpoint {folder}: {reason}. The previous checkpoint is intact: "
        f"{previous}. To go on, {fix}, then run again with recover.mode=auto to resume from it"
    )


def _os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind an error: itself, a cause or context, or a DCP rank failure."""
    pending, seen = [error], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            pending += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        pending += [e.__cause__, e.__context__]
    return None


def load_latest(run_dir: str | Path) -> tuple[Path, TrainerState] | None:
    """The newest complete checkpoint and its trainer state, or None when there is none."""
    root = checkpoint_root(run_dir)
    candidates = []
    pointer = root / LATEST
    if pointer.exists():
        candidates.append(root / pointer.read_text().strip())
    candidates += sorted(root.glob("step_*[0-9]"), reverse=True)
    for folder in candidates:
        if (folder / STATE_FILE).exists() and not folder.name.endswith(".tmp"):
            return folder, _read_state(folder)
    return None


def _read_state(folder: Path) -> TrainerState:
    path = folder / STATE_FILE
    try:
        return TrainerState(**json.loads(path.read_text()))
    except (ValueError, TypeError, OSError) as e:  # bad JSON or UTF-8, unknown or missing keys
        raise CheckpointReadError(_read_failure(folder, f"{path} is damaged ({type(e).__name__}: {e})")) from None


def _read_failure(folder: Path, problem: str) -> str:
    return (
        f"cannot restore recovery checkpoint {folder}: {problem}. To go on, delete {folder} to resume "
        "from an older checkpoint (if recover.keep_last kept one), or start afresh with "
        "recover.mode=disabled or another trial_name"
    )


def restore_checkpoint(engine, folder: str | Path) -> TrainerState:
    """Load engine weights/optimizer/schedule and this rank's RNG; returns the saved state (the
    caller takes its weight version back)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException

    folder = Path(folder)
    state = _read_state(folder)
    rng_file = folder / "rng" / f"rank{dist.get_rank()}.pt"
    if not rng_file.exists():
        raise FileNotFoundError(
            f"{rng_file} is missing: the checkpoint was written by fewer ranks; resume with the same actor.backend"
        )
    try:
        engine.load_train_state(str(folder / "train_state"))
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise CheckpointReadError(_read_failure(folder, f"its train_state cannot be loaded ({_first_line(e)})")) from e
    try:
        _set_rng_state(torch.load(rng_file, weights_only=False))
    except Exception as e:
        raise CheckpointReadError(_read_failure(folder, f"{rng_file} cannot be read ({type(e).__name__}: {e})")) from e
    return state


def _first_line(error: BaseException) -> str:
    """The root cause in one line (DCP's own message is a traceback per rank)."""
    cause = _os_error_in(error)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    while error.__cause__ is not None:
        error = error.__cause__
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        error = first[0] if isinstance(first, tuple) else first
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def _rng_state() -> dict[str, Any]:
    import numpy as np

    out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _set_rng_state(rng: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _prune(root: Path, keep_last: int) -> None:
    done = sorted(p for p in root.glob("step_*[0-9]") if (p / STATE_FILE).exists())
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted({folder, *(p for p in folder.rglob("*") if p.is_dir())}):
        _fsync_dir(d)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
