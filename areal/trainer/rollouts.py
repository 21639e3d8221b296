"""Saved rollouts: what inference-only runs write and trainer-only runs replay.

Format (under `{run_dir}/rollouts/`):
    batch_00000.pt ...   one file per batch: torch.save of a dict of tensors with a leading sample
                         dimension, right-padded: input_ids, attention_mask, loss_mask, logprobs,
                         versions (int, -1 on prompt tokens), rewards [N]
    index.json           {"format": "areal-rollouts/1", "n_samples": k, "batches": [{"file": ...,
                         "n_sequences": N, "reward_mean": r}, ...]}

Sequences of one prompt are contiguous (groups of `n_samples`), as GRPO's group normalisation
expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMAT = "areal-rollouts/1"
REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "rewards")


class RolloutWriter:
    def __init__(self, folder: str | Path, n_samples: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index = {"format": FORMAT, "n_samples": n_samples, "batches": []}

    def write(self, batch: dict[str, Any]) -> Path:
        import torch

        name = f"batch_{len(self.index['batches']):05d}.pt"
        torch.save({k: v for k, v in batch.items()}, self.folder / name)
        self.index["batches"].append({"file": name, "n_sequences": int(batch["input_ids"].shape[0]),
                                      "reward_mean": float(batch["rewards"].float().mean())})
        tmp = self.folder / "index.json.tmp"
        tmp.write_text(json.dumps(self.index, indent=2))
        tmp.replace(self.folder / "index.json")
        return self.folder / name


def read_index(folder: str | Path) -> dict:
    path = Path(folder) / "index.json"
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"rollout.replay_path={folder}: no index.json; point it at the rollouts/ "
                                "folder of an inference-only run (launcher.trainer_n_nodes=0)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"rollout.replay_path={folder}: index.json is corrupt ({e})") from None
    if index.get("format") != FORMAT or not index.get("batches"):
        raise ValueError(f"rollout.replay_path={folder}: index.json is not an {FORMAT} index with batches")
    return index


def load_batch(folder: str | Path, entry: dict) -> dict[str, Any]:
    import torch

    path = Path(folder) / entry["file"]
    try:
        batch = torch.load(path, weights_only=True)
    except Exception as e:  # truncated or foreign file
        raise ValueError(f"saved rollouts {path} cannot be read ({type(e).__name__}: {e}); "
                         "regenerate them with an inference-only run") from None
    missing = [k for k in REQUIRED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"saved rollouts {path} lack {missing}; regenerate them")
    return batch
