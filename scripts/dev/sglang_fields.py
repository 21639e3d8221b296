"""Regenerate tests/engine/data/sglang_fields.json from an SGLang source tree (no import of SGLang).

    pip download --no-deps sglang==0.5.16 -d /tmp/sgl && unzip -q /tmp/sgl/sglang-*.whl -d /tmp/sgl/src
    python scripts/dev/sglang_fields.py /tmp/sgl/src/sglang 0.5.16

The protocol tests check that every key the client sends is a field SGLang's request classes
declare (SGLang drops unknown /generate keys silently and answers unknown sampling keys with 500),
and the plan tests that every flag the launcher gives SGLang is a ServerArgs field (server_args.py:
the launcher drops, with a warning, a flag the installed SGLang lacks).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests" / "engine" / "data" / "sglang_fields.json"
REQUESTS = (
    "GenerateReqInput",
    "UpdateWeightFromDiskReqInput",
    "InitWeightsUpdateGroupReqInput",
    "UpdateWeightsFromDistributedReqInput",
    "PauseGenerationReqInput",
    "ContinueGenerationReqInput",
    "LoadLoRAAdapterReqInput",
    "UnloadLoRAAdapterReqInput",
    "UpdateWeightVersionReqInput",
    "UpdateWeightsFromTensorReqInput",
    "DestroyWeightsUpdateGroupReqInput",
    "ReleaseMemoryOccupationReqInput",
    "ResumeMemoryOccupationReqInput",
    "FlushCacheReqInput",
    "ProfileReq",
    "AbortReq",
)
BASE_FIELDS = {"rid", "http_worker_ipc"}  # BaseReq's; left out of control requests, kept for /generate


def annotated_fields(cls: ast.ClassDef) -> list[str]:
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def main(root: str, version: str) -> None:
    src = Path(root) / "srt"
    tree = ast.parse((src / "managers" / "io_struct.py").read_text())
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    sampling = ast.parse((src / "sampling" / "sampling_params.py").read_text())
    sp = next(n for n in ast.walk(sampling) if isinstance(n, ast.ClassDef) and n.name == "SamplingParams")
    out: dict = {
        "_source": f"Field names of SGLang {version}'s request classes (managers/io_struct.py; BaseReq's rid and "
        "http_worker_ipc left out of the control requests), SamplingParams (sampling/sampling_params.py) and "
        "ServerArgs (server_args.py), written by scripts/dev/sglang_fields.py."
    }
    for name in REQUESTS:
        names = annotated_fields(classes[name])
        out[name] = names if name == "GenerateReqInput" else [f for f in names if f not in BASE_FIELDS]
    out["SamplingParams"] = annotated_fields(sp)
    server_args = ast.parse((src / "server_args.py").read_text())
    out["ServerArgs"] = annotated_fields(
        next(n for n in ast.walk(server_args) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    )
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} from sglang {version}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
