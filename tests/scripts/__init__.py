"""Tests of the scripts under scripts/ (not a package): `load_script` imports one by its path."""

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py as a fresh module (NAME may name a subfolder: "dev/gil_share")."""
    spec = importlib.util.spec_from_file_location(Path(name).name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
