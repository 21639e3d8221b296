"""A fast in-process stand-in for the CPU demo, to screen its hyperparameters over many seeds.

    python scripts/dev/sim_demo.py --seeds 1 2 3 4 --init-seed 0 --data-seed 0 --no-std \
        --entropy 0.06 --minibatches 4 --uniform-answers --steps 250 [--stale --lr 1e-3 ...]

The same tiny model, tokenizer, task, reward, group-normalised advantages and clipped loss
(areal.algo) as `tiny_arith_cpu.yaml`, in one process with no server, weight updates or launcher:
synchronous and on-policy, or with --stale one update behind with the decoupled loss, as the
demo's async pipeline runs. The demo builds one model (init seed 0) and one dataset (seed 0) for
every run seed; --init-seed 0 --data-seed 0 does the same. It reports the held-out accuracy over
the evaluation steps, over every problem once at the end (`every_pair`, what the demo's
evaluation measures) and the problems still wrong. It only ranks settings; a setting is chosen
by the real demo (scripts/demo_seeds.py), which this does not replace.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import tempfile

import torch

from areal.algo.advantages import group_normalize
from areal.algo.ppo import ppo_actor_loss
from areal.dataset.synthetic import load_synthetic_arith, make_synthetic_arith
from areal.models.resolve import TINY_PRESETS
from areal.models.tiny import make_tiny_model_dir
from areal.reward.registry import resolve_reward_fn
from areal.reward.shaped import arith_exact_reward


def build(hidden: int, layers: int, seed: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {**TINY_PRESETS["arith"], "hidden_size": hidden, "num_layers": layers}
    path = make_tiny_model_dir(tempfile.mkdtemp() + "/m", seed=seed, **kwargs)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def sample(model, prompts: torch.Tensor, max_new: int, temperature: float, eos: int, greedy=False):
    """Completions [B, max_new] (EOS then padding EOS), their logprobs and loss mask."""
    seq = prompts
    done = torch.zeros(len(prompts), dtype=torch.bool)
    toks, lps, mask = [], [], []
    for _ in range(max_new):
        logits = model(seq).logits[:, -1].float()
        logp = torch.log_softmax(logits / temperature, -1)
        nxt = logits.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
        toks.append(nxt)
        lps.append(logp.gather(-1, nxt[:, None]).squeeze(-1))
        mask.append(~done)
        done = done | (nxt == eos)
        seq = torch.cat([seq, nxt[:, None]], 1)
    return torch.stack(toks, 1), torch.stack(lps, 1), torch.stack(mask, 1).float()


def token_logprobs(model, prompts, completions, temperature):
    full = torch.cat([prompts, completions], 1)
    logits = model(full).logits[:, prompts.shape[1] - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, completions[..., None]).squeeze(-1), entropy


def run(seed: int, args) -> dict:
    torch.manual_seed(seed)
    # the demo builds one init (seed 0) and one dataset (seed 0) for every run seed
    init_seed = seed if args.init_seed is None else args.init_seed
    data_seed = seed if args.data_seed is None else args.data_seed
    model, tok = build(args.hidden, args.layers, init_seed)
    train = load_synthetic_arith("train", size=1024, seed=data_seed, uniform_answers=args.uniform_answers)
    test = load_synthetic_arith("test", size=args.test_size, seed=data_seed)
    every_pair = make_synthetic_arith(55, 0, balanced=True)  # each problem once

    def encode(recs):  # every prompt "a+b=" has one length: no padding
        return torch.tensor([[tok.bos_token_id] + tok.encode(r["question"], add_special_tokens=False) for r in recs])

    behav_model = copy.deepcopy(model) if args.stale else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: args.min_lr + (1 - args.min_lr) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))
    )
    evals = {}
    gen = torch.Generator().manual_seed(seed)
    reward_fn = resolve_reward_fn(args.reward)
    for step in range(args.steps + 1):
        if step % args.eval_every == 0:
            comp, _, _ = sample(model, encode(test), 3, 1.0, tok.eos_token_id, greedy=True)
            texts = tok.batch_decode(comp, skip_special_tokens=True)
            evals[step] = statistics.fmean(arith_exact_reward("", t, **r) for t, r in zip(texts, test))
            wrong = sorted({f"{r['question']}{t!r}" for t, r in zip(texts, test) if not arith_exact_reward("", t, **r)})
        if step == args.steps:
            break
        idx = torch.randint(len(train), (args.batch,), generator=gen).tolist()
        recs = [train[i] for i in idx for _ in range(args.n)]
        prompts = encode(recs)
        comp, old_lp, mask = sample(behav_model, prompts, 3, args.temperature, tok.eos_token_id)
        behav_lp = None
        if args.stale:  # the demo's async pipeline: rollouts one version behind, decoupled loss
            behav_lp = old_lp
            with torch.no_grad():
                old_lp, _ = token_logprobs(model, prompts, comp, args.temperature)
            behav_model.load_state_dict(model.state_dict())
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        rewards = torch.tensor([reward_fn("", t, **r) for t, r in zip(texts, recs)])
        adv = group_normalize(rewards, args.n, std=not args.no_std)[:, None].expand_as(mask)
        order = torch.randperm(len(recs), generator=gen)
        for mb in order.chunk(args.minibatches):
            lp, ent = token_logprobs(model, prompts[mb], comp[mb], args.temperature)
            loss, _ = ppo_actor_loss(
                lp,
                old_lp[mb],
                adv[mb],
                mask[mb],
                eps_clip=args.eps_clip,
                eps_clip_high=args.eps_clip_high,
                behav_logprobs=None if behav_lp is None else behav_lp[mb],
                behav_imp_weight_cap=5.0 if args.stale else None,
            )
            if args.entropy:
                loss = loss - args.entropy * (ent * mask[mb]).sum() / mask[mb].sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        sched.step()
    comp, _, _ = sample(model, encode(every_pair), 3, 1.0, tok.eos_token_id, greedy=True)
    texts = tok.batch_decode(comp, skip_special_tokens=True)
    every_pair_acc = statistics.fmean(arith_exact_reward("", t, **r) for t, r in zip(texts, every_pair))
    return {
        "seed": seed,
        "final": round(evals[args.steps], 3),
        "every_pair": round(every_pair_acc, 3),
        "curve": {k: round(v, 3) for k, v in evals.items()},
        "wrong": wrong,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--hidden", type=int, default=TINY_PRESETS["arith"]["hidden_size"])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--entropy", type=float, default=0.0)
    p.add_argument("--eps-clip", type=float, default=0.2)
    p.add_argument("--eps-clip-high", type=float, default=None)
    p.add_argument(
        "--stale",
        action="store_true",
        help="sample with the weights one update behind, as the demo's async pipeline does",
    )
    p.add_argument("--test-size", type=int, default=64)
    p.add_argument(
        "--uniform-answers",
        action="store_true",
        help="train problems with every answer equally frequent (synthetic_arith kwarg)",
    )
    p.add_argument("--reward", default="arith_near", help="a workflow.reward_fn name or import path")
    p.add_argument(
        "--init-seed", type=int, default=None, help="model init seed (default: the run seed; the demo uses 0)"
    )
    p.add_argument("--data-seed", type=int, default=None, help="dataset seed (default: the run seed; the demo uses 0)")
    p.add_argument("--no-std", action="store_true", help="advantages without the group std (Dr.GRPO)")
    args = p.parse_args()
    torch.set_num_threads(1)
    results = [run(s, args) for s in args.seeds]
    finals = [r["final"] for r in results]
    print(json.dumps({"args": vars(args), "min": min(finals), "median": statistics.median(finals), "results": results}))


if __name__ == "__main__":
    main()
