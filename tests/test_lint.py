"""`ruff check .` is clean and `ruff format --check .` has nothing to rewrite, with the configuration in
pyproject.toml ([tool.ruff]). The dev extra installs ruff, so the README's test command runs both."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_ruff = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[dev]' installs it)"
)


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@needs_ruff
def test_ruff_check_is_clean():
    proc = _ruff("check", "--no-cache", "--output-format", "concise", ".")
    assert proc.returncode == 0, f"ruff check . found problems:\n{proc.stdout}{proc.stderr}"


@needs_ruff
def test_ruff_format_has_nothing_to_rewrite():
    proc = _ruff("format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, (
        f"ruff format would rewrite these files (run `ruff format .`):\n{proc.stdout}{proc.stderr}"
    )
