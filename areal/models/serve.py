"""Start a server program on a model the project names: `python -m areal.models.serve MODULE ARGS...`.

SGLang loads folders and hub ids; `tiny:<preset>` and `smollm2:135m-instruct` are the project's own
names (areal.models.resolve). This resolves the values of --model-path and --tokenizer-path to the
folder every process of the run shares (built once, under a file lock), then replaces itself with
`python -m MODULE ARGS...` (same process id, so the launcher's process handling is unchanged).

`python -m areal.models.serve --skip-unused-models sglang.launch_server ARGS...` (with
launcher.sglang_skip_unused_models) also sets SGLANG_DISABLED_MODEL_ARCHS, unless it is set
already, to the SGLang model modules the resolved model does not need (areal/infra/sglang_registry.py),
and says so in the server's log.
"""

from __future__ import annotations

import logging
import os
import sys

from areal.infra.model_names import is_project_model
from areal.infra.servers import SKIP_UNUSED_MODELS_FLAG
from areal.infra.sglang_registry import ENV as DISABLED_ARCHS_ENV
from areal.infra.sglang_registry import disabled_model_archs

from .resolve import resolve_model_path

logger = logging.getLogger("areal.models.serve")

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


def skip_unused_sglang_models(args: list[str]) -> None:
    """Set SGLANG_DISABLED_MODEL_ARCHS for this SGLang command line (where the user has not)."""
    if DISABLED_ARCHS_ENV in os.environ:
        logger.info("%s is set already: SGLang's model registry is left as it is", DISABLED_ARCHS_ENV)
        return
    found = disabled_model_archs(args)
    if found is None:
        logger.info("SGLang imports every model module (the model's architectures were not found in its source)")
        return
    os.environ[DISABLED_ARCHS_ENV], note = found
    logger.info("%s (%s)", note, DISABLED_ARCHS_ENV)


def main(argv: list[str]) -> None:
    skip = bool(argv) and argv[0] == SKIP_UNUSED_MODELS_FLAG
    argv = argv[1:] if skip else argv
    if not argv:
        sys.exit(
            f"usage: python -m areal.models.serve [{SKIP_UNUSED_MODELS_FLAG}] MODULE [ARGS...]  "
            "(e.g. sglang.launch_server --model-path ...)"
        )
    module, args = argv[0], resolved_args(argv[1:])
    if skip and module.startswith("sglang"):
        from areal.infra.log_format import setup_process_logging

        setup_process_logging(stream=sys.stderr)
        skip_unused_sglang_models(args)
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
