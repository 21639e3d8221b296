from pathlib import Path

from areal.config.reference import render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "config_reference.md"


def test_config_reference_is_up_to_date():
    assert DOC.read_text() == render_reference(), (
        "docs/config_reference.md is stale: run python scripts/gen_config_reference.py"
    )


def test_reference_lists_every_leaf_with_its_description():
    text = render_reference()
    assert "| `actor.optimizer.lr` |" in text and "Peak learning rate." in text
    assert "## `actor.optimizer`" in text and "## `cluster.name_resolve`" in text
