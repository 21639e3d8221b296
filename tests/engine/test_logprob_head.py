"""actor.fused_logprobs: logprobs from the hidden states equal those from the logits, and so do
their gradients and a whole training step of the engine."""

import pytest
import torch

from areal.engine.fsdp.logprob_head import LogprobHead, linear_token_logprobs
from areal.engine.fsdp.logprobs import token_logprobs_and_entropy
from tests.engine.test_fsdp_helpers import make_batch, nll_loss, one_torch_thread, token_weight
from tests.engine.test_fsdp_helpers import one_rank_engine as _engine


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_the_logits_path(temperature):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (37,), generator=g)
    upstream = torch.randn(37, generator=g, dtype=torch.float64)  # an arbitrary loss: sum(upstream * lp)
    results = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:  # chunks of 8 rows: 5 chunks, the last one short
            lp, ent = linear_token_logprobs(h, w, targets, temperature=temperature, chunk=8)
        else:
            lp, ent = token_logprobs_and_entropy(h @ w.t(), targets, temperature=temperature)
        (upstream * lp).sum().backward()
        results.append((lp.detach(), ent, h.grad, w.grad))
    for fused, plain in zip(*results):
        assert torch.allclose(fused, plain, atol=1e-10, rtol=0), (fused - plain).abs().max()


def test_outside_predicting_the_head_is_the_linear_layer():
    linear = torch.nn.Linear(8, 20, bias=False)
    model = torch.nn.Module()
    model.get_output_embeddings = lambda: linear
    model.set_output_embeddings = lambda m: setattr(model, "head", m)
    head = LogprobHead.replace_in(model)
    assert model.head is head and head.weight is linear.weight  # the same parameter: ties survive
    x = torch.randn(1, 5, 8)
    assert torch.equal(head(x), linear(x))
    with head.predicting(torch.tensor([1, 2, 3, 4])):
        assert head(x).shape == (1, 4, 2)
    assert head(x).shape == (1, 5, 20)


def test_a_head_with_a_bias_is_refused():
    model = torch.nn.Module()
    model.get_output_embeddings = lambda: torch.nn.Linear(8, 20)
    with pytest.raises(ValueError, match="actor.fused_logprobs=false"):
        LogprobHead.replace_in(model)


@pytest.mark.parametrize(
    "tied, fused, compiled",
    [(True, True, False), (False, True, False), (True, False, True), (False, True, True)],
    ids=["fused-tied", "fused-untied", "compiled", "fused-compiled"],
)
def test_engine_step_matches_the_eager_logits_path(tmp_path, tied, fused, compiled):
    """actor.fused_logprobs and actor.compile_logprobs, alone and together, against neither."""
    from torch._dynamo.utils import counters

    from areal.models.tiny import make_tiny_model_dir

    model_dir = str(make_tiny_model_dir(tmp_path / "m", tie_word_embeddings=tied))
    batch = make_batch(4)
    torch._dynamo.reset()
    counters.clear()
    runs = []
    for variant in (True, False):
        engine = _engine(model_dir, fused_logprobs=fused and variant, compile_logprobs=compiled and variant)
        try:
            assert isinstance(engine.model.get_output_embeddings(), LogprobHead) == (fused and variant)
            before, entropy = engine.forward(batch, with_entropy=True, temperature=0.9)
            stats = engine.train_batch(batch, nll_loss, token_weight, temperature=0.9)
            runs.append((before, entropy, stats, engine.forward(batch)))
        finally:
            engine.destroy()
    (lp_f, ent_f, st_f, after_f), (lp_p, ent_p, st_p, after_p) = runs
    assert (lp_f - lp_p).abs().max() < 1e-5 and (ent_f - ent_p).abs().max() < 1e-5
    assert st_f["loss"] == pytest.approx(st_p["loss"], rel=1e-6)
    assert st_f["grad_norm"] == pytest.approx(st_p["grad_norm"], rel=1e-5)
    assert st_f["n_microbatches"] >= 2
    assert (after_f - after_p).abs().max() < 1e-5  # the same update
    assert (after_p - lp_p).abs().max() > 1e-3  # ...which moved the model
    assert (counters["stats"]["unique_graphs"] > 0) == compiled  # compiled kernels ran, or none did
