"""Per-request sampling for a batch of sequences, following SGLang's conventions.

Conventions (checked against SGLang 0.5.x `layers/sampler.py` and `sampling_params.py`):

* Greedy: temperature < 1e-6 or top_k == 1. SGLang rewrites temperature 0 as
  (temperature 1, top_k 1); we do the same, so greedy picks `argmax(logits)`.
* Returned logprobs: log-probabilities of the chosen token under the *temperature-scaled*
  distribution `log_softmax(logits / T)`, taken before top-k/top-p truncation (SGLang's default,
  i.e. without its RETURN_ORIGINAL_LOGPROB switch). Greedy rows use T = 1, so they report the
  model's raw log-probabilities. This is what an RL trainer that recomputes logprobs with the same
  temperature expects.
* top-k then top-p are applied to the sorted, temperature-scaled probabilities; top-p keeps the
  smallest prefix whose mass reaches top_p (always at least one token).
* min_new_tokens: until that many tokens exist, stop tokens (EOS and stop_token_ids) get -inf
  logits, as SGLang's min-new-tokens penalizer does; the logprobs see the masked logits.
* sampling_seed (SGLang's sampling parameter): a row whose request names a seed draws its token
  from random numbers that depend only on that seed and the token's position in the sequence
  (prompt included), not on the server's generator, the other requests in the batch or their
  order. Without it, rows share the server's generator (--random-seed), so what a request draws
  depends on which requests the scheduler batched with it and in which order, which HTTP arrival
  order decides. A request resubmitted after an abort (prompt + tokens so far) draws at each
  position what it would have drawn uninterrupted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GREEDY_EPS = 1e-6


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling parameters of one request (SGLang names and defaults)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1


def sample(logits, params: list[SamplingParams], generator=None, positions: list[int] | None = None):
    """Pick one token per row of `logits` [B, V] with each row's own params. `positions[i]` is
    the position in its sequence of the token row i samples; rows with a sampling_seed need it.

    Returns (token_ids [B] long, logprobs [B] float32); see the module docstring for the
    logprob convention.
    """
    import torch

    logits = logits.float()
    device = logits.device
    greedy = torch.tensor([p.greedy for p in params], device=device)
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
    scaled = logits / temps.unsqueeze(1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    seeded = [i for i, p in enumerate(params) if p.sampling_seed is not None and not p.greedy]
    if len(seeded) < len(params) and not bool(greedy.all()):
        sampled = _sample_top_k_top_p(scaled, params, generator)
        tokens = torch.where(greedy, tokens, sampled)
    if seeded:
        if positions is None:
            raise ValueError("sample(): rows with a sampling_seed need their positions")
        rows = torch.tensor(seeded, device=device)
        tokens[rows] = _sample_seeded(scaled[rows], [params[i] for i in seeded], [positions[i] for i in seeded])
    logprobs = logprobs_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, logprobs


def _sample_top_k_top_p(scaled, params: list[SamplingParams], generator):
    """Multinomial draw from the top-k / top-p truncated softmax of `scaled` [B, V]."""
    import torch

    vocab = scaled.shape[-1]
    probs = torch.softmax(scaled, dim=-1)
    if not any(_truncates(p, vocab) for p in params):
        # RL rollouts sample the full distribution: skip the [B, V] sort (the costliest part of
        # a decode step's sampling at B=256, V=151k).
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    sorted_probs, sorted_idx = _sorted_truncated(probs, params)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return sorted_idx.gather(1, choice).squeeze(1)


def _sample_seeded(scaled, params: list[SamplingParams], positions: list[int]):
    """One draw per row of `scaled` [R, V] from its top-k / top-p truncated softmax, by inverting
    the row's cumulative distribution at one number in (0, 1) that is a hash of (sampling_seed,
    position) alone: no other row's numbers and no generator state enter, so the draw is the same
    whatever the batch. All rows at once (one cumsum and one search, no per-row generator)."""
    import torch

    probs = torch.softmax(scaled, dim=-1)
    vocab = scaled.shape[-1]
    if any(_truncates(p, vocab) for p in params):
        probs = _truncated(probs, params)
    # the top 24 bits of the 63-bit hash, centred in their interval: never 0 or 1
    u = [((_mix(p.sampling_seed, pos) >> 39) + 0.5) / (1 << 24) for p, pos in zip(params, positions)]
    cdf = probs.cumsum(dim=-1)
    target = torch.tensor(u, device=probs.device, dtype=cdf.dtype) * cdf[:, -1]
    # the first token whose cumulative mass exceeds the target (never one of mass 0)
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1).clamp(max=vocab - 1)


def _truncated(probs, params: list[SamplingParams]):
    """`probs` [B, V] with the tokens outside each row's top-k / top-p set to 0 (not renormalised)."""
    import torch

    sorted_probs, sorted_idx = _sorted_truncated(probs, params)
    return torch.zeros_like(probs).scatter_(1, sorted_idx, sorted_probs)


def _sorted_truncated(probs, params: list[SamplingParams]):
    """(`probs` [B, V] sorted descending per row, with the tokens outside each row's top-k, then
    top-p, set to 0 (not renormalised); the token id at each sorted place)."""
    import torch

    vocab = probs.shape[-1]
    device = probs.device
    top_ks = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    top_ps = torch.tensor([p.top_p for p in params], device=device)
    sorted_probs, sorted_idx = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device).unsqueeze(0)
    sorted_probs = sorted_probs.masked_fill(ranks >= top_ks.unsqueeze(1), 0.0)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before > top_ps.unsqueeze(1), 0.0)
    return sorted_probs, sorted_idx


_MASK64 = (1 << 64) - 1


def _mix(seed: int, position: int) -> int:
    """A 63-bit generator seed from (seed, position): splitmix64's finaliser over both, so
    neighbouring seeds and positions give unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def _truncates(params: SamplingParams, vocab: int) -> bool:
    """Whether top-k or top-p removes any token of a `vocab`-sized distribution."""
    return 0 < params.top_k < vocab or params.top_p < 1.0


def mask_stop_tokens(logits, rows: list[int], stop_ids: list[list[int]]) -> None:
    """In place: forbid stop tokens on `rows` (those still below min_new_tokens)."""
    for row, ids in zip(rows, stop_ids):
        if ids:
            logits[row, ids] = float("-inf")
