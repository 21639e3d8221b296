"""Proximal logprobs without the recompute pass (actor.prox_logp_method=loglinear).

The decoupled loss needs log p_prox(token), the trainer's weights at the start of the step
(version V), for every generated token. The recompute pass gets them with one more forward over
the whole batch (a quarter of an asynchronous step on the 0.5B shape, docs/benchmarks.md
section 10). Two logprobs of each token come for free: the behaviour logprob from the server
(`logprobs`, at the token's version v_b <= V) and, inside the training forward of PPO
minibatch k of n, the current weights' (which stand k/n of a version past V: each step's n
optimizer steps make one version). Assuming log p moves linearly with the version between
those two points gives the proximal one by interpolation, AReaL's "proximal log-probability
approximation" (its docs, algorithms/prox_approx; there the current weights are always one version
past the proximal ones), here with the current weights' actual progress through the step:

    log p_prox ~ log p_behav + alpha (log p_cur - log p_behav),   alpha = (V - v_b) / (V - v_b + k/n)

- minibatch 0 (k = 0): alpha = 1, the current weights are the proximal ones and the value is
  exact (as actor.recompute_first_minibatch=false takes it);
- a token of the current version (v_b = V), later minibatches: alpha = 0, the server's logprob
  (the same weights, up to the servers' and the trainer's numerical differences);
- a stale token: in between, leaning on the current weights the staler the token is.

The current logprob enters detached: the approximation is a constant of the loss, as a recomputed
logprob is. Torch-only, no engine.
"""

from __future__ import annotations

import torch


def interpolation_weight(versions: torch.Tensor, version: int, progress: float) -> torch.Tensor:
    """alpha per token ([B, L] float32) for tokens generated at `versions` (-1 where no token was
    generated), the proximal weights' `version` V and the current weights' `progress` past them
    in versions (k/n in minibatch k of n)."""
    if not 0.0 <= progress < 1.0:
        raise ValueError(f"progress={progress} must lie in [0, 1): minibatch k of n trains at k/n")
    lag = (version - versions).clamp(min=0).to(torch.float32)  # a token from a later version: none
    if progress == 0.0:
        return torch.ones_like(lag)
    return lag / (lag + progress)


def approximate_proximal(behav: torch.Tensor, current: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """log p_prox ~ behav + alpha (current - behav), with `current` detached."""
    return torch.lerp(behav, current.detach().to(behav.dtype), alpha.to(behav.dtype))
