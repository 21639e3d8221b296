"""Saved rollouts (areal-rollouts/1) damaged on disk: each kind of damage is refused with an error
that names the file and says how to get good rollouts again."""

import json
import shutil

import pytest
import torch

from areal.trainer.rollouts import RolloutWriter, load_batch, read_index


def batch(n=4, length=6):
    return {
        "input_ids": torch.randint(0, 15, (n, length)),
        "attention_mask": torch.ones(n, length, dtype=torch.long),
        "loss_mask": torch.ones(n, length, dtype=torch.long),
        "logprobs": torch.randn(n, length),
        "versions": torch.zeros(n, length, dtype=torch.long),
        "rewards": torch.rand(n),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved") / "rollouts"
    writer = RolloutWriter(folder, n_samples=2)
    for _ in range(2):
        writer.write(batch())
    return folder


def read_all(folder):
    return [load_batch(folder, entry) for entry in read_index(folder)["batches"]]


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path, at=0.5):
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i : i + 16] = bytes(b ^ 0xFF for b in data[i : i + 16])
    path.write_bytes(bytes(data))


def edit_index(folder, change):
    index = json.loads((folder / "index.json").read_text())
    change(index)
    (folder / "index.json").write_text(json.dumps(index))


def without_checksums(folder):
    edit_index(folder, lambda index: [e.pop("sha256") for e in index["batches"]])


CASES = {
    "truncated batch": (lambda f: truncate(f / "batch_00001.pt"), "batch_00001.pt are damaged: their sha256"),
    "bytes flipped in tensor data": (lambda f: flip(f / "batch_00000.pt", 0.9), "batch_00000.pt are damaged"),
    "deleted batch": (lambda f: (f / "batch_00001.pt").unlink(), "missing: ['batch_00001.pt']"),
    "deleted index": (lambda f: (f / "index.json").unlink(), "no index.json"),
    "garbage index": (lambda f: (f / "index.json").write_text('{"format": "areal-rol'), "index.json is corrupt"),
    "index not UTF-8": (lambda f: (f / "index.json").write_bytes(b"\xff\xfe\x00{"), "index.json is corrupt"),
    "index of another kind": (lambda f: (f / "index.json").write_text("[1, 2]"), "is not an areal-rollouts/1 index"),
    "entry without a file": (
        lambda f: edit_index(f, lambda i: i["batches"][1].pop("file")),
        "lists batches that are not",
    ),
    "truncated batch, old index without checksums": (
        lambda f: (without_checksums(f), truncate(f / "batch_00000.pt")),
        "batch_00000.pt cannot be read",
    ),
    "foreign file, old index": (
        lambda f: (without_checksums(f), (f / "batch_00000.pt").write_bytes(b"not torch")),
        "batch_00000.pt cannot be read",
    ),
    "sample count differs from the index": (
        lambda f: (without_checksums(f), torch.save({**batch(), "rewards": torch.rand(3)}, f / "batch_00000.pt")),
        "sample counts",
    ),
    "a key missing": (
        lambda f: (without_checksums(f), torch.save({"input_ids": torch.zeros(4, 2)}, f / "batch_00001.pt")),
        "lack tensors",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_rollouts_are_refused_naming_the_file_and_the_fix(saved, tmp_path, case):
    damage, needle = CASES[case]
    folder = tmp_path / "rollouts"
    shutil.copytree(saved, folder)
    assert len(read_all(folder)) == 2  # intact copy reads
    damage(folder)
    with pytest.raises((ValueError, FileNotFoundError)) as failed:
        read_all(folder)
    message = str(failed.value)
    assert needle in message and str(folder) in message, message
    assert "inference-only run (launcher.trainer_n_nodes=0)" in message, message
