"""Regenerate docs/config_reference.md from the schema's descriptions.

    python scripts/gen_config_reference.py [--check]

--check exits 1 when the file on disk is stale (tests/config/test_reference.py does the same).
"""

import argparse
import sys
from pathlib import Path

from areal.config.reference import render_reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "config_reference.md"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    text = render_reference()
    if args.check:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is stale: run python scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
