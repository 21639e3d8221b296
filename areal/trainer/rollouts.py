"""Saved rollouts: what inference-only runs write and trainer-only runs replay.

Format (under `{run_dir}/rollouts/`):
    batch_00000.pt ...   one file per batch: torch.save of a dict of tensors with a leading sample
                         dimension, right-padded: input_ids, attention_mask, loss_mask, logprobs,
                         versions (int, -1 on prompt tokens), rewards [N]
    index.json           {"format": "areal-rollouts/1", "n_samples": k, "batches": [{"file": ...,
                         "n_sequences": N, "reward_mean": r, "sha256": hex}, ...]}

Sequences of one prompt are contiguous (groups of `n_samples`), as GRPO's group normalisation
expects.

Reading checks what can go wrong on disk and names the file and the fix: a missing or unreadable
index, entries without a file, a missing, truncated or foreign batch file, a checksum mismatch
(sha256, written since this field was added; older indexes without it still load), missing keys
or a sample count that differs from the index.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FORMAT = "areal-rollouts/1"
REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "rewards")
REGENERATE = (
    "regenerate them with an inference-only run (launcher.trainer_n_nodes=0), or point "
    "rollout.replay_path at another rollouts/ folder"
)


class RolloutWriter:
    def __init__(self, folder: str | Path, n_samples: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index = {"format": FORMAT, "n_samples": n_samples, "batches": []}

    def write(self, batch: dict[str, Any]) -> Path:
        import torch

        name = f"batch_{len(self.index['batches']):05d}.pt"
        torch.save({k: v for k, v in batch.items()}, self.folder / name)
        self.index["batches"].append(
            {
                "file": name,
                "n_sequences": int(batch["input_ids"].shape[0]),
                "reward_mean": float(batch["rewards"].float().mean()),
                "sha256": _sha256(self.folder / name),
            }
        )
        tmp = self.folder / "index.json.tmp"
        tmp.write_text(json.dumps(self.index, indent=2))
        tmp.replace(self.folder / "index.json")
        return self.folder / name


def read_index(folder: str | Path) -> dict:
    path = Path(folder) / "index.json"
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"rollout.replay_path={folder}: no index.json; point it at the rollouts/ "
            "folder of an inference-only run (launcher.trainer_n_nodes=0)"
        ) from None
    except (ValueError, OSError) as e:  # bad JSON or UTF-8, a folder named index.json, ...
        raise ValueError(f"rollout.replay_path={folder}: {path} is corrupt ({e}); {REGENERATE}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not index.get("batches"):
        raise ValueError(f"rollout.replay_path={folder}: {path} is not an {FORMAT} index with batches; {REGENERATE}")
    batches = index["batches"]
    if not isinstance(batches, list) or not all(
        isinstance(e, dict) and isinstance(e.get("file"), str) for e in batches
    ):
        raise ValueError(
            f"rollout.replay_path={folder}: {path} lists batches that are not "
            f'{{"file": name, ...}} entries; {REGENERATE}'
        )
    missing = [e["file"] for e in batches if not (Path(folder) / e["file"]).is_file()]
    if missing:  # found now rather than at the step that needs them
        raise FileNotFoundError(
            f"rollout.replay_path={folder}: batch files listed in {path} are missing: "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''}; {REGENERATE}"
        )
    return index


def load_batch(folder: str | Path, entry: dict) -> dict[str, Any]:
    import torch

    path = Path(folder) / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(
            f"saved rollouts {path} are missing (listed in {Path(folder) / 'index.json'}); {REGENERATE}"
        )
    if entry.get("sha256") and _sha256(path) != entry["sha256"]:
        raise ValueError(
            f"saved rollouts {path} are damaged: their sha256 differs from the one in "
            f"index.json (changed or truncated after writing); {REGENERATE}"
        )
    try:
        batch = torch.load(path, weights_only=True)
    except Exception as e:  # truncated or foreign file
        raise ValueError(f"saved rollouts {path} cannot be read ({type(e).__name__}: {e}); {REGENERATE}") from None
    if not isinstance(batch, dict):
        raise ValueError(f"saved rollouts {path} hold a {type(batch).__name__}, not a dict of tensors; {REGENERATE}")
    missing = [k for k in REQUIRED_KEYS if not isinstance(batch.get(k), torch.Tensor)]
    if missing:
        raise ValueError(f"saved rollouts {path} lack tensors {missing}; {REGENERATE}")
    sizes = {k: int(batch[k].shape[0]) if batch[k].dim() else None for k in REQUIRED_KEYS}
    expected = entry.get("n_sequences", sizes["input_ids"])
    if set(sizes.values()) != {expected}:
        raise ValueError(
            f"saved rollouts {path}: sample counts {sizes} differ from the index's n_sequences {expected}; {REGENERATE}"
        )
    return batch


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
