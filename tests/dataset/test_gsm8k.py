"""GSM8K loading from the layouts users have, and prompt building through chat templates."""

import json
import sys
import types

import pytest

from areal.dataset.gsm8k import build_prompt, load_gsm8k
from tests.dataset.gsm8k_data import gsm8k_dir

ROWS = [
    {"question": "How many legs do 2 cats have?", "answer": "2 * 4 = 8\n#### 8"},
    {"question": "What is 600 + 634?", "answer": "600 + 634 = 1,234\n#### 1,234"},
]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_shared_copy_has_both_splits_with_solutions():
    folder = gsm8k_dir()
    train, test = load_gsm8k(str(folder), "train"), load_gsm8k(str(folder), "test")
    assert (len(train), len(test)) == (7473, 1319)
    first = test[0]
    assert set(first) == {"question", "answer", "solution"}
    assert first["question"].startswith("Janet")
    assert first["solution"] == "18"
    assert all(r["solution"].lstrip("-").isdigit() for r in train + test)  # commas stripped


def test_single_file_path_ignores_split(tmp_path):
    write_jsonl(tmp_path / "mine.jsonl", ROWS)
    records = load_gsm8k(str(tmp_path / "mine.jsonl"), "whatever")
    assert [r["solution"] for r in records] == ["8", "1234"]


def test_hub_snapshot_layout_prefers_config_subfolder(tmp_path):
    write_jsonl(tmp_path / "main" / "test-00000-of-00002.jsonl", ROWS[:1])
    write_jsonl(tmp_path / "main" / "test-00001-of-00002.jsonl", ROWS[1:])
    write_jsonl(tmp_path / "main" / "train-00000-of-00001.jsonl", ROWS * 3)
    write_jsonl(tmp_path / "socratic" / "test-00000-of-00001.jsonl", ROWS * 5)
    assert [r["solution"] for r in load_gsm8k(str(tmp_path), "test")] == ["8", "1234"]
    assert len(load_gsm8k(str(tmp_path), "train")) == 6
    assert len(load_gsm8k(str(tmp_path), "test", config="socratic")) == 10


def test_parquet_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "main").mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "main" / "train-00000-of-00001.parquet")
    records = load_gsm8k(str(tmp_path), "train")
    assert records[1] == {**ROWS[1], "solution": "1234"}


def test_missing_split_names_folder_and_files_found(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(FileNotFoundError) as err:
        load_gsm8k(str(tmp_path), "test")
    assert str(tmp_path) in str(err.value) and "test.jsonl" in str(err.value)
    assert "train.jsonl" in str(err.value)  # shows what is there


def test_rows_without_final_answer_are_reported(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [ROWS[0], {"question": "q", "answer": "no marker"}])
    with pytest.raises(ValueError, match="row 1 .*#### N"):
        load_gsm8k(str(tmp_path), "train")
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "q"}])
    with pytest.raises(ValueError, match="'question'"):
        load_gsm8k(str(tmp_path), "test")


def test_hub_id_without_datasets_suggests_local_folder(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(FileNotFoundError) as err:
        load_gsm8k("openai/gsm8k", "test")
    assert "'openai/gsm8k'" in str(err.value) and "local folder" in str(err.value)


def test_hub_id_goes_through_datasets_with_config(monkeypatch):
    calls = []

    def fake_load_dataset(path, name, split):
        calls.append((path, name, split))
        return ROWS

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset))
    records = load_gsm8k("openai/gsm8k", "test")
    assert calls == [("openai/gsm8k", "main", "test")]
    assert [r["solution"] for r in records] == ["8", "1234"]


def test_hub_failure_is_reported_with_cause(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(FileNotFoundError, match="ConnectionError: hub unreachable"):
        load_gsm8k("openai/gsm8k")


@pytest.fixture(scope="module")
def char_tokenizer():
    from areal.models.tiny import build_char_tokenizer

    return build_char_tokenizer()


def test_build_prompt_tiny_template(char_tokenizer):
    ids = build_prompt(char_tokenizer, "3+4=")
    assert ids[0] == char_tokenizer.bos_token_id
    assert ids.count(char_tokenizer.bos_token_id) == 1  # template's bos only, none added twice
    assert char_tokenizer.decode(ids[1:]) == "3+4="


def test_build_prompt_uses_roles_and_generation_prompt(char_tokenizer):
    tok = char_tokenizer
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    try:
        ids = build_prompt(tok, "what is two", system_prompt="be brief")
    finally:
        from areal.models.tiny import CHAT_TEMPLATE

        tok.chat_template = CHAT_TEMPLATE
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == "system: be brief\nuser: what is two\nassistant: "


def test_build_prompt_without_template_is_a_clear_error(char_tokenizer):
    tok = char_tokenizer
    saved, tok.chat_template = tok.chat_template, None
    try:
        with pytest.raises(ValueError, match="no chat template"):
            build_prompt(tok, "1+1=")
    finally:
        tok.chat_template = saved


def test_shortest_keeps_the_shortest_questions_in_order(tmp_path):
    rows = [{"question": "q" * n, "answer": f"x\n#### {n}"} for n in (30, 5, 20, 10, 40)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    got = load_gsm8k(str(tmp_path), "train", shortest=3)
    assert [len(r["question"]) for r in got] == [5, 20, 10]
    with pytest.raises(ValueError, match="shortest=0"):
        load_gsm8k(str(tmp_path), "train", shortest=0)
