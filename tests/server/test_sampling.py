"""The sampler draws from the right distribution on both paths (full softmax and top-k/top-p)."""

import pytest

torch = pytest.importorskip("torch")

from areal.server.sampling import SamplingParams, sample  # noqa: E402

LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
DRAWS = 20000


def frequencies(params: SamplingParams, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = LOGITS.expand(DRAWS, -1).clone()
    tokens, logprobs = sample(logits, [params] * DRAWS, gen)
    return torch.bincount(tokens, minlength=4).float() / DRAWS, tokens, logprobs


def expected(probs: list[float]) -> torch.Tensor:
    p = torch.tensor(probs)
    return p / p.sum()


@pytest.mark.parametrize(
    "params, probs",
    [
        (SamplingParams(), [0.5, 0.25, 0.15, 0.1]),  # full distribution
        (SamplingParams(top_k=10**6), [0.5, 0.25, 0.15, 0.1]),  # top-k beyond the vocab
        (SamplingParams(top_k=2), [0.5, 0.25, 0, 0]),
        (SamplingParams(top_p=0.7), [0.5, 0.25, 0, 0]),  # mass before token 2 is 0.75
        (SamplingParams(temperature=2.0), [0.5**0.5, 0.25**0.5, 0.15**0.5, 0.1**0.5]),
    ],
)
def test_token_frequencies_follow_the_truncated_distribution(params, probs):
    freq, _, _ = frequencies(params)
    torch.testing.assert_close(freq, expected(probs), atol=0.015, rtol=0)


def test_logprobs_are_of_the_temperature_scaled_distribution_before_truncation():
    _, tokens, logprobs = frequencies(SamplingParams(temperature=2.0, top_k=2))
    ref = torch.log_softmax(LOGITS / 2.0, -1)
    torch.testing.assert_close(logprobs, ref[tokens])


def test_same_seed_same_tokens_and_rows_use_their_own_params():
    a = frequencies(SamplingParams(), seed=3)[1]
    b = frequencies(SamplingParams(), seed=3)[1]
    assert torch.equal(a, b)
    mixed = [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams()]
    tokens, _ = sample(LOGITS.expand(3, -1).clone(), mixed, torch.Generator().manual_seed(0))
    assert tokens[:2].tolist() == [0, 0]


@pytest.mark.parametrize(
    "params, probs",
    [
        (SamplingParams(), [0.5, 0.25, 0.15, 0.1]),
        (SamplingParams(top_k=2), [0.5, 0.25, 0, 0]),
        (SamplingParams(top_p=0.7), [0.5, 0.25, 0, 0]),
        (SamplingParams(temperature=2.0), [0.5**0.5, 0.25**0.5, 0.15**0.5, 0.1**0.5]),
    ],
)
def test_seeded_rows_follow_the_truncated_distribution(params, probs):
    from dataclasses import replace

    n = 4000  # one draw per seed: the distribution over seeds is the one asked for
    rows = [replace(params, sampling_seed=s) for s in range(n)]
    tokens, _ = sample(LOGITS.expand(n, -1).clone(), rows, torch.Generator().manual_seed(0), [7] * n)
    freq = torch.bincount(tokens, minlength=4).float() / n
    torch.testing.assert_close(freq, expected(probs), atol=0.03, rtol=0)


def test_a_seeded_row_draws_the_same_whatever_the_batch_and_the_server_generator():
    """What a request with a sampling_seed draws depends on (seed, position) only: not on the
    rows batched with it, their order, or the state of the server's generator."""
    flat = torch.zeros(16)  # uniform: every token equally likely, so any dependence would show
    alone = [sample(flat[None].clone(), [SamplingParams(sampling_seed=5)], None, [p])[0].item() for p in range(40)]
    assert len(set(alone)) > 4  # positions draw different numbers
    for p in range(40):
        others = [SamplingParams(), SamplingParams(sampling_seed=9), SamplingParams(temperature=0)]
        rows = [*others[: p % 3], SamplingParams(sampling_seed=5), *others[p % 3 :]]
        gen = torch.Generator().manual_seed(p)
        positions = [p + 3] * len(rows)
        positions[p % 3] = p
        tokens, _ = sample(flat.expand(4, -1).clone(), rows, gen, positions)
        assert tokens[p % 3].item() == alone[p]


def test_sampling_seed_is_parsed_and_checked():
    from areal.server.validation import BadRequest, parse_sampling

    assert parse_sampling({"sampling_seed": 3}, 16).sampling_seed == 3
    assert parse_sampling({}, 16).sampling_seed is None
    with pytest.raises(BadRequest, match="sampling_seed"):
        parse_sampling({"sampling_seed": "3"}, 16)
