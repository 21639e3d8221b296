"""Where the shared GSM8K copy lives for tests: $AREAL_GSM8K_DIR, else ../shared/data/gsm8k
beside the repository root (CI clones the repo with shared/ next to it)."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def gsm8k_dir() -> Path:
    """The GSM8K folder, or skip the calling test with the paths that were tried."""
    tried = [Path(os.environ["AREAL_GSM8K_DIR"])] if os.environ.get("AREAL_GSM8K_DIR") else []
    tried.append(REPO_ROOT.parent / "shared" / "data" / "gsm8k")
    for path in tried:
        if (path / "test.jsonl").is_file():
            return path
    pytest.skip(f"GSM8K data not found (tried {', '.join(map(str, tried))}); set AREAL_GSM8K_DIR")
