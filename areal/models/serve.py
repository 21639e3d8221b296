"""Start a server program on a model the project names: `python -m areal.models.serve MODULE ARGS...`.

SGLang loads folders and hub ids; `tiny:<preset>` and `smollm2:135m-instruct` are the project's own
names (areal.models.resolve). This resolves the values of --model-path and --tokenizer-path to the
folder every process of the run shares (built once, under a file lock), then replaces itself with
`python -m MODULE ARGS...` (same process id, so the launcher's process handling is unchanged).
"""

from __future__ import annotations

import os
import sys

from areal.infra.model_names import is_project_model

from .resolve import resolve_model_path

PATH_FLAGS = ("--model-path", "--tokenizer-path")


def resolved_args(args: list[str]) -> list[str]:
    """args with the value after each of PATH_FLAGS (or in --flag=value form) resolved."""
    out = list(args)
    for i, arg in enumerate(out):
        flag, eq, value = arg.partition("=")
        if flag in PATH_FLAGS and eq and is_project_model(value):
            out[i] = f"{flag}={resolve_model_path(value)}"
        elif arg in PATH_FLAGS and i + 1 < len(out) and is_project_model(out[i + 1]):
            out[i + 1] = resolve_model_path(out[i + 1])
    return out


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m areal.models.serve MODULE [ARGS...]  (e.g. sglang.launch_server --model-path ...)")
    module, args = argv[0], resolved_args(argv[1:])
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
