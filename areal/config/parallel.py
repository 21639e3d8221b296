"""Parallel-strategy strings, parsed in one place.

Grammar: `<backend>:<dims>` where dims is a sequence of `<letter><int>` with letters
  d  data-parallel size (trainer: FSDP shard x replicate; inference: number of servers)
  t  tensor-parallel size (inside one trainer group or one server)
  r  HSDP replicate groups (trainer only): d must be divisible by r; shard size is d / r
Each letter at most once; missing letters default to 1. Examples: `fsdp:d4`, `fsdp:d2t2`,
`fsdp:d4r2` (HSDP: 2 replicas x 2 shards), `sglang:d2t1`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIM = re.compile(r"([a-z])(\d+)")
ALLOWED_DIMS = {"fsdp": "dtr", "sglang": "dt", "builtin": "dt"}


class ParallelStrategyError(ValueError):
    """A backend string that does not follow the grammar above."""


@dataclass(frozen=True)
class ParallelStrategy:
    backend: str
    dp: int = 1
    tp: int = 1
    replicate: int = 1

    @property
    def world_size(self) -> int:
        """Devices used: every data-parallel member holds tp devices."""
        return self.dp * self.tp

    @property
    def shard(self) -> int:
        """FSDP shard-group size inside one HSDP replica."""
        return self.dp // self.replicate

    def __str__(self) -> str:
        dims = f"d{self.dp}t{self.tp}" + (f"r{self.replicate}" if self.replicate > 1 else "")
        return f"{self.backend}:{dims}"


def parse_parallel(spec: str, *, allowed_backends: tuple[str, ...] = tuple(ALLOWED_DIMS)) -> ParallelStrategy:
    """Parse `fsdp:d2t2`-style strings; raises ParallelStrategyError with an example of a valid one."""
    example = {"fsdp": "fsdp:d4t1 (or fsdp:d4r2 for HSDP)", "sglang": "sglang:d2t1"}
    if not isinstance(spec, str) or ":" not in spec:
        raise ParallelStrategyError(
            f"'{spec}' is not a parallel strategy; expected '<backend>:<dims>', e.g. "
            + " or ".join(example[b] for b in allowed_backends if b in example)
        )
    backend, dims = spec.split(":", 1)
    if backend not in allowed_backends:
        raise ParallelStrategyError(f"backend '{backend}' in '{spec}' is not one of {list(allowed_backends)}")
    pos, sizes = 0, {}
    for m in _DIM.finditer(dims):
        if m.start() != pos:
            break
        letter, size = m.group(1), int(m.group(2))
        if letter not in ALLOWED_DIMS[backend]:
            raise ParallelStrategyError(
                f"dimension '{letter}' in '{spec}' is not allowed for {backend}; "
                f"allowed: {', '.join(ALLOWED_DIMS[backend])}"
            )
        if letter in sizes:
            raise ParallelStrategyError(f"dimension '{letter}' appears twice in '{spec}'")
        if size < 1:
            raise ParallelStrategyError(f"dimension '{letter}{size}' in '{spec}' must be >= 1")
        sizes[letter] = size
        pos = m.end()
    if pos != len(dims) or not sizes:
        raise ParallelStrategyError(f"cannot parse '{dims}' in '{spec}'; expected letters with sizes such as 'd4t1'")
    strategy = ParallelStrategy(backend, sizes.get("d", 1), sizes.get("t", 1), sizes.get("r", 1))
    if strategy.dp % strategy.replicate:
        raise ParallelStrategyError(
            f"HSDP replicate r{strategy.replicate} must divide the data-parallel size d{strategy.dp} in '{spec}'"
        )
    return strategy
