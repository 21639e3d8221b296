"""version_spans: which output tokens each weight version produced (the built-in server's
meta_info.output_version_spans)."""

from areal.server.routes_generate import version_spans
from areal.server.sampling import SamplingParams
from areal.server.scheduler import Sequence


def seq(n_out, changes):
    s = Sequence(
        rid="r",
        input_ids=[1],
        params=SamplingParams(),
        return_logprob=True,
        on_finish=lambda _: None,
        version_spans=list(changes),
    )
    s.output_ids = list(range(n_out))
    return s


def test_one_version_is_one_span():
    assert version_spans(seq(5, [(0, "3")])) == [[0, "3"]]
    assert version_spans(seq(0, [(0, "3")])) == [[0, "3"]]


def test_a_change_mid_answer_splits_it():
    assert version_spans(seq(6, [(0, "3"), (4, "4")])) == [[0, "3"], [4, "4"]]


def test_changes_without_tokens_between_them_keep_the_later():
    assert version_spans(seq(6, [(0, "3"), (4, "4"), (4, "5")])) == [[0, "3"], [4, "5"]]
    assert version_spans(seq(6, [(0, "3"), (0, "4")])) == [[0, "4"]]


def test_a_change_after_the_last_token_and_a_repeated_version_are_dropped():
    assert version_spans(seq(4, [(0, "3"), (4, "4")])) == [[0, "3"]]
    assert version_spans(seq(6, [(0, "3"), (2, "3"), (5, "4")])) == [[0, "3"], [5, "4"]]
