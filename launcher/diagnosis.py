"""Known causes of a failed process, read from the last lines of its log: each turns into one
"hint:" line under the error, naming the config keys that fix it.

The patterns are the messages SGLang 0.5.16 and torch print for failures users meet on a shared
GPU (tests/launcher/fixtures holds the real lines they were written against). A log that matches
none gets no hint: the error and the log's tail stand alone, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    pattern: re.Pattern
    hint: str  # format() gets the pattern's groups


CAUSES = (
    Cause(
        re.compile(r"leave no GPU memory for the KV cache under --mem-fraction-static=([\d.]+)"),
        "SGLang found no room for its KV cache at sglang.mem_fraction_static={0}. It sizes the cache from "
        "the free memory it sees before and after loading its weights, so another process allocating "
        "in between (a second run started on the same GPU at the same time) counts against it. Start "
        "runs that share a GPU one at a time, or raise sglang.mem_fraction_static.",
    ),
    Cause(
        re.compile(r"Can not import FA3"),
        "this SGLang has no FA3 kernels (SGLang picks FA3 on Hopper by default): set "
        "sglang.attention_backend=triton or flashinfer.",
    ),
    Cause(
        re.compile(r"CUDA out of memory"),
        "the GPU ran out of memory. Where servers and the trainer share it (launcher.colocate), give the "
        "trainer less to hold (actor.fused_logprobs=true keeps no [tokens, vocab] logits; a smaller "
        "actor.max_tokens_per_mb) or the server a smaller sglang.mem_fraction_static.",
    ),
)


def hints(lines: list[str]) -> list[str]:
    """One hint per known cause found in these log lines, in the order of CAUSES."""
    found = []
    for cause in CAUSES:
        for line in lines:
            m = cause.pattern.search(line)
            if m:
                found.append("hint: " + cause.hint.format(*m.groups()))
                break
    return found
