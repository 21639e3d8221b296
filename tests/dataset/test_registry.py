"""load_dataset_by_name: built-in names, local paths, user loaders by import path."""

import json

import pytest

from areal.dataset import load_dataset_by_name
from tests.dataset.gsm8k_data import gsm8k_dir


def test_gsm8k_by_name_with_path_and_env(monkeypatch):
    folder = str(gsm8k_dir())
    assert len(load_dataset_by_name("gsm8k", "test", path=folder)) == 1319
    monkeypatch.setenv("AREAL_GSM8K_DIR", folder)
    assert len(load_dataset_by_name("gsm8k", "test")) == 1319


def test_synthetic_by_name_passes_kwargs():
    records = load_dataset_by_name("synthetic_arith", "test", size=10, seed=2, max_sum=5)
    assert len(records) == 10 and all(int(r["solution"]) <= 5 for r in records)
    with pytest.raises(ValueError, match="takes no path"):
        load_dataset_by_name("synthetic_arith", path="/data")


def test_local_folder_keeps_extra_fields_and_adds_solution(tmp_path):
    rows = [{"question": "q", "answer": "x\n#### 1,500", "id": 7}, {"prompt": "free-form"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_dataset_by_name(str(tmp_path), "train")
    assert records == [{**rows[0], "solution": "1500"}, rows[1]]
    assert load_dataset_by_name(str(tmp_path / "train.jsonl"), "ignored") == records


def test_user_loader_by_import_path():
    records = load_dataset_by_name("tests.dataset.user_loaders:load_pairs", "train", n=3, path="/p")
    assert [r["question"] for r in records] == ["train-0", "train-1", "train-2"]
    assert records[0]["source"] == "/p"


def test_user_loader_errors_name_the_spec():
    with pytest.raises(TypeError, match="load_strings.*list of dicts"):
        load_dataset_by_name("tests.dataset.user_loaders:load_strings")
    with pytest.raises(TypeError, match="NOT_CALLABLE"):
        load_dataset_by_name("tests.dataset.user_loaders:NOT_CALLABLE")
    with pytest.raises(ImportError, match="no_such_module"):
        load_dataset_by_name("no_such_module:load")
    with pytest.raises(ImportError, match="has no attribute 'missing'"):
        load_dataset_by_name("tests.dataset.user_loaders:missing")
    # an argument the loader does not take (say, inherited from the demo's kwargs): named, with the fix
    with pytest.raises(TypeError, match=r"load_pairs.*\['n', 'uniform_answers'\].*uniform_answers.*=null"):
        load_dataset_by_name("tests.dataset.user_loaders:load_pairs", n=2, uniform_answers=True)


def test_unknown_spec_lists_the_accepted_forms():
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'.*gsm8k.*import path"):
        load_dataset_by_name("gsm9k")
