"""The launcher stays torch-free: importing it must not pull in the training stack (or Ray)."""

from __future__ import annotations

import subprocess
import sys

from tests.launcher.helpers import REPO, repo_env

CHECK = """
import sys
import launcher.cli, launcher.local, launcher.ray, launcher.plan, launcher.procs, areal.infra.health
heavy = [m for m in ("torch", "transformers", "sglang", "ray") if m in sys.modules]
print(",".join(heavy))
"""


def test_launcher_imports_no_torch():
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported by the launcher: {done.stdout.strip()}"
