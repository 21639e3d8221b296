"""Run a small CPU plan whose servers are the /health stand-in, as `areal-launch` would.

    python -m tests.launcher.run_plan FILEROOT [hydra overrides...]

For launcher tests that signal a launcher process but need no model (areal-launch itself would
start real inference servers). Exit code: the backend's.
"""

from __future__ import annotations

import sys

from launcher.cli import write_run_dir
from tests.launcher.helpers import make_cfg, make_plan


def main(argv: list[str]) -> int:
    cfg = make_cfg(argv[0], *argv[1:])
    plan = make_plan(cfg)
    write_run_dir(cfg, plan)
    if cfg.launcher.backend == "ray":
        from launcher.ray import run_ray

        return run_ray(plan, cfg)
    from launcher.local import run_local

    return run_local(plan, cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
