"""Facts about the launching machine that a plan depends on, gathered without importing torch.

The launcher's make_plan stays pure by taking these as an argument (tests pass HostFacts they
construct); RemoteSGLangEngine.from_pretrained reads them to start servers the same way.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostFacts:
    cuda_available: bool = False
    sglang_version: str | None = None
    # Flags of the installed sglang's ServerArgs ("--tp-size", ...); None when unknown.
    sglang_flags: frozenset[str] | None = None
    python: str = sys.executable
    gpu_memory_bytes: int | None = None  # the smallest visible GPU's memory; None without nvidia-smi


def detect_host_facts() -> HostFacts:
    version = _installed_version("sglang")
    return HostFacts(
        cuda_available=_cuda_visible(),
        sglang_version=version,
        sglang_flags=_sglang_flags() if version else None,
        python=sys.executable,
        gpu_memory_bytes=_gpu_memory_bytes(),
    )


def _gpu_memory_bytes() -> int | None:
    """memory.total of the smallest GPU nvidia-smi lists (MiB -> bytes)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return None
    rows = query_gpus("memory.total", units=False, timeout=10)
    sizes = [int(row) for row in rows or [] if row.isdigit()]
    return min(sizes) * 2**20 if sizes else None


def query_gpus(fields: str, *, units: bool = True, timeout: float = 30.0) -> list[str] | None:
    """One line per GPU of `nvidia-smi --query-gpu=<fields>` (CSV, no header; `units=False` drops
    MiB and the like), or None where nvidia-smi is missing, fails or hangs."""
    if not shutil.which("nvidia-smi"):
        return None
    fmt = "--format=csv,noheader" + ("" if units else ",nounits")
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", fmt], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else None


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cuda_visible() -> bool:
    """A GPU is usable here: the driver's device nodes exist and CUDA_VISIBLE_DEVICES hides none of it."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists():
        return True
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
            return out.returncode == 0 and "GPU" in out.stdout
        except (OSError, subprocess.TimeoutExpired):
            return False
    return False


def _sglang_flags() -> frozenset[str] | None:
    """Read ServerArgs' field names from sglang's source (importing sglang would pull in torch)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(list(spec.submodule_search_locations)[0]) / "srt" / "server_args.py"
    try:
        tree = ast.parse(src.read_text())
    except (OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            names = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            return frozenset("--" + n.replace("_", "-") for n in names)
    return None


def resolve_device(cfg, facts: HostFacts) -> str:
    """cluster.device with `auto` resolved on this host."""
    if cfg.cluster.device == "auto":
        return "cuda" if facts.cuda_available else "cpu"
    return cfg.cluster.device


def resolve_server_kind(cfg, facts: HostFacts, device: str) -> str:
    """rollout.server with `auto` resolved: SGLang where it is installed and CUDA is present."""
    if cfg.rollout.server != "auto":
        return cfg.rollout.server
    return "sglang" if facts.sglang_version and device == "cuda" else "builtin"
