"""Recovery checkpoints and Hugging Face model folders damaged on disk (truncated, bytes flipped,
files deleted, garbage JSON): refused with an error naming the path and the way out, in one
process (a one-rank gloo group)."""

import shutil
from pathlib import Path

import pytest
import torch

from tests.engine.test_fsdp_helpers import make_batch, nll_loss, token_weight


def truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_header(path: Path):
    """Garble the first bytes (a zip/pickle/safetensors header): detectable, unlike a flip inside
    tensor data, which neither DCP nor safetensors checksums."""
    data = bytearray(path.read_bytes())
    data[:16] = bytes(b ^ 0xFF for b in data[:16])
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from areal.engine.fsdp.engine import FSDPEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = FSDPEngine.from_pretrained(tiny_model_dir, dtype="float32", learning_rate=1e-3, max_tokens_per_mb=30)
    yield eng
    eng.destroy()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved_run(engine, tmp_path_factory):
    from areal.trainer import checkpoint as ck

    run = tmp_path_factory.mktemp("run")
    engine.train_batch(make_batch(5), nll_loss, token_weight)
    ck.save_checkpoint(engine, run, ck.TrainerState(step=3, dataloader_position=3))
    return run


def shard(folder: Path) -> Path:
    return sorted((folder / "train_state").glob("*.distcp"))[0]


CHECKPOINT_CASES = {
    "truncated tensor shard": (lambda f: truncate(shard(f)), "train_state cannot be loaded"),
    "deleted tensor shard": (lambda f: shard(f).unlink(), "No such file"),
    "garbled DCP metadata": (lambda f: flip_header(f / "train_state" / ".metadata"), "train_state cannot be loaded"),
    "garbled engine state": (lambda f: flip_header(f / "train_state" / "engine.pt"), "train_state cannot be loaded"),
    "truncated RNG state": (lambda f: truncate(f / "rng" / "rank0.pt"), "rank0.pt cannot be read"),
    "garbage trainer_state.json": (
        lambda f: (f / "trainer_state.json").write_text('{"step": 3,'),
        "trainer_state.json is damaged",
    ),
    "trainer_state.json of another shape": (
        lambda f: (f / "trainer_state.json").write_text('{"stepp": 3}'),
        "trainer_state.json is damaged",
    ),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_damaged_checkpoint_is_refused_naming_the_path_and_the_fix(engine, saved_run, tmp_path, case):
    from areal.trainer import checkpoint as ck

    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    folder, state = ck.load_latest(run)
    assert ck.restore_checkpoint(engine, folder).step == 3  # the intact copy restores
    damage, needle = CHECKPOINT_CASES[case]
    damage(folder)
    with pytest.raises(ck.CheckpointReadError) as failed:
        found = ck.load_latest(run)  # a damaged trainer_state.json already fails here
        ck.restore_checkpoint(engine, found[0])
    message = str(failed.value)
    assert message.startswith(f"cannot restore recovery checkpoint {folder}: ") and needle in message, message
    assert f"delete {folder} to resume from an older checkpoint" in message
    assert "recover.mode=disabled" in message


HF_CASES = {
    "truncated model.safetensors": (lambda d: truncate(d / "model.safetensors"), "SafetensorError"),
    "garbled safetensors header": (lambda d: flip_header(d / "model.safetensors"), "SafetensorError"),
    "deleted model.safetensors": (lambda d: (d / "model.safetensors").unlink(), "no file named model.safetensors"),
    "garbage config.json": (lambda d: (d / "config.json").write_text("{garbage"), "not a valid JSON"),
    "deleted config.json": (lambda d: (d / "config.json").unlink(), "config.json"),
}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_damaged_model_folder_is_refused_naming_the_key_and_the_path(tiny_model_dir, tmp_path, case):
    """The trainer's actor.path; the server's --model-path and /update_weights_from_disk use the
    same message (tests/server)."""
    from areal.engine.fsdp.engine import FSDPEngine

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    damage, needle = HF_CASES[case]
    damage(model)
    with pytest.raises(ValueError) as failed:
        FSDPEngine.from_pretrained(str(model), dtype="float32")
    message = str(failed.value)
    assert message.startswith(f"actor.path={model}: the model cannot be loaded (") and needle in message, message
    assert "complete Hugging Face folder" in message and "point actor.path at another folder" in message
