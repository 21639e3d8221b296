"""FSDPEngine: a Hugging Face causal LM trained with FSDP2 (+ HSDP / tensor parallelism).

One engine per trainer process; all processes of the trainer call every method (they are
collective), with their own share of the batch (`dp_shard`); tensor-parallel peers get the same
rows. Run under `torchrun --nproc-per-node N` (or any launcher that sets RANK/WORLD_SIZE); in a
single process without those variables the engine makes a one-rank group itself.

    engine = FSDPEngine.from_pretrained("/path/to/model", dp_size=1, dtype="float32")
    logp = engine.forward(batch)                                   # [B, L] per-token logprobs
    stats = engine.train_batch(batch, loss_fn, loss_weight_fn)     # one optimizer step

Precision: parameters and optimizer state are fp32 (master copy); compute runs in actor.dtype
and gradients are reduced in actor.grad_reduce_dtype (FSDP2 MixedPrecisionPolicy).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

from areal.api.train import Batch, LossFn, TrainEngine
from areal.api.weights import WeightSink, WeightUpdateMeta

from . import packing, shared_prompts, state, weight_sync
from .mb_budget import CudaMemory, TokenBudget
from .optim import build_optimizer, build_scheduler, clip_grad_norm
from .parallelize import (
    apply_fsdp,
    apply_tp,
    build_mesh,
    check_tp_divisible,
    compile_decoder_layers,
    dp_mesh,
    flat_dp_mesh,
)

logger = logging.getLogger("areal.fsdp")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class FSDPEngine(TrainEngine):
    """See the module docstring. `config` is an ActorConfig (areal.config.actor). `memory_share`:
    the fraction of the device actor.max_tokens_per_mb=auto may count on (beside colocated servers,
    areal.config.experiment.trainer_memory_share); None, all of it."""

    def __init__(
        self,
        config,
        *,
        experiment_name: str | None = None,
        trial_name: str | None = None,
        fileroot: str | None = None,
        trainable: bool = True,
        device: str | None = None,
        attn_implementation: str | None = None,
        memory_share: float | None = None,
    ):
        from areal.config.cluster import ClusterConfig
        from areal.config.experiment import ExperimentConfig

        if not config.path:
            raise ValueError("actor.path is required: a Hugging Face model folder or hub id")
        fields = ExperimentConfig.model_fields  # the schema's defaults, not a copy of them
        self.config = config
        self.experiment_name = experiment_name or fields["experiment_name"].default
        self.trial_name = trial_name or fields["trial_name"].default
        self.fileroot = fileroot or ClusterConfig.model_fields["fileroot"].default
        self.trainable = trainable
        self._device_type = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.attn_implementation = attn_implementation
        self.model = self.optimizer = self.scheduler = self.tokenizer = self.mesh = self._dp_group = None
        self._owns_process_group = False
        self.offloaded = False  # parameters and optimizer state are in CPU memory (offload())
        # actor.max_tokens_per_mb: fixed, or (auto) measured on CUDA per pass kind (mb_budget.py)
        memory = CudaMemory(memory_share) if self._device_type == "cuda" else None
        self.mb_budget = TokenBudget(
            config.max_tokens_per_mb, config.mb_memory_headroom, memory, checkpointing=config.gradient_checkpointing
        )

    @classmethod
    def from_pretrained(cls, model: str, **kwargs) -> "FSDPEngine":
        """Build and initialize an engine in one call; see `factory.build_engine` for the arguments."""
        from .factory import build_engine

        return build_engine(cls, model, **kwargs)

    # ---- setup --------------------------------------------------------------------------------
    def initialize(self, total_train_steps: int | None = None) -> None:
        """Process group, mesh, model (loaded, parallelised, sharded), optimizer and schedule.

        total_train_steps is needed by linear/cosine schedules and warmup. It counts optimizer
        steps (train_batch calls): with several PPO minibatches per training step, pass
        training steps x minibatches, as the GRPO trainer does.
        """
        from areal.config.parallel import parse_parallel

        cfg = self.config
        self.strategy = parse_parallel(cfg.backend, allowed_backends=("fsdp",))
        if cfg.use_lora and self.strategy.tp > 1:
            raise ValueError(
                f"actor.use_lora with tensor parallelism ({cfg.backend}) is not supported; "
                "use a backend without t (e.g. fsdp:d2) for LoRA"
            )
        self._init_process_group()
        try:
            self._build(total_train_steps)
        except BaseException:
            self.destroy()  # leaves no half-made process group behind
            raise

    def _build(self, total_train_steps: int | None) -> None:
        cfg = self.config
        self.mesh = build_mesh(self.strategy, self.device_type)
        self._dp_group = flat_dp_mesh(self.mesh).get_group()
        self.param_dtype = DTYPES[cfg.dtype]
        model = self._load_model()
        if self.strategy.tp > 1:
            check_tp_divisible(model.config, self.strategy.tp)
            apply_tp(model, self.mesh["tp"])
        apply_fsdp(model, dp_mesh(self.mesh), param_dtype=self.param_dtype, reduce_dtype=DTYPES[cfg.grad_reduce_dtype])
        if cfg.compile:
            compile_decoder_layers(model)
        self.model = model
        if self.trainable:
            self.optimizer = build_optimizer(model.parameters(), cfg.optimizer)
            self.scheduler = build_scheduler(self.optimizer, cfg.optimizer, total_train_steps)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path or cfg.path)

    def _init_process_group(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            backend = dist.get_backend()
            if self.device_type == "cuda" and "nccl" not in str(backend):
                raise RuntimeError(f"the default process group uses {backend}; CUDA training needs nccl")
        else:
            backend = "cuda:nccl,cpu:gloo" if self.device_type == "cuda" else "gloo"
            # every collective (and the rendezvous) fails after this instead of waiting forever for a
            # rank that hangs; the launcher names actor.collective_timeout_s when a rank fails so
            from areal.config.actor import ActorConfig

            default = ActorConfig.model_fields["collective_timeout_s"].default  # a RefConfig has none
            timeout = timedelta(seconds=getattr(self.config, "collective_timeout_s", default))
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                dist.init_process_group(backend, timeout=timeout)
            else:  # a plain single process (notebook, script): a one-rank group of our own
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            self._owns_process_group = True
        if self.device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        self._rank, self.world_size = dist.get_rank(), dist.get_world_size()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def device(self) -> torch.device:
        if self.device_type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _load_model(self):
        from transformers import AutoModelForCausalLM

        cfg = self.config
        attn = self.attn_implementation or _default_attention(self.device_type)
        if attn == "areal_packed_sdpa":
            from .attention import register

            register(compiled=cfg.compile)
        self.attn_implementation = attn
        self.share_prompts = _share_prompts(cfg, attn, self.device_type)
        try:
            model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=torch.float32, attn_implementation=attn)
        except Exception as exc:  # OSError, JSON, safetensors' own SafetensorError, ...
            from areal.models.resolve import model_load_error

            raise ValueError(model_load_error("actor.path", cfg.path, exc)) from exc
        self.hf_config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        self.tied_lm_head = bool(getattr(model.config, "tie_word_embeddings", False))
        # logits on the loss tokens' predecessors only, where the model can keep a subset of rows
        self.loss_rows_only = not cfg.logprobs_on_every_token and _keeps_logit_rows(model)
        self.logprob_head = None
        if cfg.fused_logprobs:
            from .logprob_head import LogprobHead

            self.logprob_head = LogprobHead.replace_in(model, compiled=cfg.compile_logprobs)
        if cfg.gradient_checkpointing:
            _enable_checkpointing(model)
        self.lora_scaling = None
        if cfg.use_lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=cfg.lora_rank,
                    lora_alpha=cfg.lora_alpha,
                    lora_dropout=cfg.lora_dropout,
                    target_modules=list(cfg.target_modules),
                    task_type="CAUSAL_LM",
                ),
            )
            self.lora_scaling = cfg.lora_alpha / cfg.lora_rank
        return model.to(self.device)

    # ---- data-parallel layout --------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        return self.strategy.dp

    @property
    def tp_size(self) -> int:
        return self.strategy.tp

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp_replicate") * self.strategy.shard + self.mesh.get_local_rank("dp_shard")

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def dp_shard(self, batch: Batch) -> Batch:
        """This data-parallel rank's contiguous share of a full batch (TP peers get the same rows)."""
        n = batch["input_ids"].shape[0]
        if n % self.dp_size:
            raise ValueError(
                f"{n} sequences do not split over {self.dp_size} data-parallel ranks "
                f"(actor.backend={self.config.backend})"
            )
        size = n // self.dp_size
        lo, hi = self.dp_rank * size, (self.dp_rank + 1) * size
        return {k: v[lo:hi] if _per_sequence(v, n) else v for k, v in batch.items()}

    # ---- micro-batches ---------------------------------------------------------------------------
    def _microbatches(self, batch: Batch, kind: str = "forward") -> list[packing.PackedMicroBatch]:
        """Packed micro-batches within the token budget of a `kind` pass ("forward" or "train":
        mb_budget.py); every rank gets the same count (FSDP collectives need it)."""
        lengths = packing.sequence_lengths(batch["attention_mask"])
        budget, min_count = self.mb_budget.plan(kind, lengths)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        loss_mask = batch.get("loss_mask") if self.loss_rows_only else None
        loss_mask = None if loss_mask is None else loss_mask.cpu()  # one copy a pass, not one a micro-batch
        if self.share_prompts and loss_mask is not None:
            ids = batch["input_ids"].cpu()
            prompts = shared_prompts.prompt_lengths(loss_mask, lengths)
            plan = functools.partial(shared_prompts.allocate, ids, lengths, prompts, budget)
            bins = self._same_count_on_every_rank(plan, min_count)
            return [shared_prompts.pack(ids, lengths, prompts, loss_mask, groups, pad) for groups in bins]
        plan = functools.partial(packing.allocate, lengths, budget)
        bins = self._same_count_on_every_rank(plan, min_count)
        return [packing.pack(batch["input_ids"], lengths, b, pad, loss_mask) for b in bins]

    def _same_count_on_every_rank(self, plan: Callable[..., list], min_count: int) -> list:
        """plan(min_count=...)'s bins, again with more where another rank has more (FSDP's collectives
        need the same number of passes on every rank)."""
        import torch.distributed as dist

        bins = plan(min_count=min_count)
        count = torch.tensor(len(bins), device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return plan(min_count=int(count)) if int(count) > len(bins) else bins

    def _token_logprobs(self, mb: packing.PackedMicroBatch, temperature: float, with_entropy: bool = True):
        """(logprobs [T], entropy [T] or None, the model's output) of one packed row: position t
        gets log p(token t | the tokens before it), 0 at each sequence's first token; with
        actor.fused_logprobs, from the hidden states. Where mb.head_rows is set, the lm_head runs on
        those rows only (logits_to_keep) and the tokens they predict get figures (0 elsewhere)."""
        from .logprobs import token_logprobs_and_entropy

        ids = mb.input_ids[0].to(self.device)
        if mb.head_rows is None:  # every row: row t predicts token t + 1
            at, keep, targets = None, {}, ids[1:]
        else:
            rows = mb.head_rows.to(self.device, non_blocking=True)
            at = rows + 1 if mb.head_targets is None else mb.head_targets.to(self.device, non_blocking=True)
            keep, targets = {"logits_to_keep": rows}, ids[at]
        if self.logprob_head is None:
            out = self._run_model(mb, **keep)  # [T, V] logits, or [n, V] of the kept rows
            lp, ent = token_logprobs_and_entropy(
                out if keep else out[:-1],
                targets,
                temperature=temperature,
                with_entropy=with_entropy,
                compiled=self.config.compile_logprobs,
            )
        else:
            with self.logprob_head.predicting(targets, temperature, with_entropy):
                out = self._run_model(mb, **keep)  # [len(targets), 2]: logprob, entropy
            lp, ent = out[:, 0], out[:, 1] if with_entropy else None
        if at is None:
            return (*packing.align_to_tokens(lp, ent, mb.seqlens), out)
        return (*packing.scatter_to_tokens(lp, ent, at, ids.shape[0]), out)

    def _run_model(self, mb: packing.PackedMicroBatch, **model_kwargs) -> torch.Tensor:
        """The model's output for one packed row: [T, V] logits, or [T - 1, 2] while the LogprobHead
        predicts (_token_logprobs), or of the kept rows only (logits_to_keep in model_kwargs).
        Attention never crosses sequence boundaries."""
        ids = mb.input_ids.to(self.device)
        pos = mb.position_ids.to(self.device)
        seqlens = mb.seqlens or [1]
        kwargs = {}
        if self.attn_implementation == "sdpa":  # dense block-diagonal mask: O(T^2), for checks
            kwargs["attention_mask"] = packing.block_causal_mask(seqlens, device=self.device)
        elif self.attn_implementation == "eager":
            kwargs["attention_mask"] = packing.block_causal_mask(seqlens, device=self.device, dtype=self.param_dtype)
        elif mb.shared is not None:  # shared prompts: areal_packed_sdpa gathers each segment's keys
            sh = mb.shared
            kwargs.update(
                cu_seq_lens_q=sh.cu_q.to(self.device),
                cu_seq_lens_k=sh.cu_k.to(self.device),
                max_length_q=sh.max_q,
                max_length_k=sh.max_k,
                areal_kv_index=sh.kv_index.to(self.device),
            )
        else:  # varlen: areal_packed_sdpa and flash-attention read the sequence boundaries
            cu = torch.tensor([0, *seqlens], device=self.device).cumsum(0).to(torch.int32)
            kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(seqlens), max_length_k=max(seqlens))
        out = self.model(input_ids=ids, position_ids=pos, use_cache=False, **kwargs, **model_kwargs)
        return out.logits[0]

    @staticmethod
    def _sub_batch(batch: Batch, mb: packing.PackedMicroBatch, device) -> Batch:
        """The rows of one micro-batch, right-padded to its longest sequence, on device."""
        n, width = batch["input_ids"].shape[0], max(mb.seqlens)
        rows = torch.tensor(mb.indices)
        out = {}
        for key, value in batch.items():
            if _per_sequence(value, n):
                value = value[rows]
                if value.dim() >= 2 and value.shape[1] == batch["input_ids"].shape[1]:
                    value = value[:, :width]
                value = value.to(device)
            out[key] = value
        return out

    # ---- compute ---------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False):
        """Per-token logprobs [B, L] (fp32, on the batch's device); with_entropy adds entropy [B, L].

        logprobs[i, j] = log p(input_ids[i, j] | input_ids[i, :j]) at the given sampling
        temperature; 0 at j = 0 and on padding, and, where the batch has a loss_mask, on the tokens
        outside it (their logits are never computed) unless actor.logprobs_on_every_token.
        """
        self._require_initialized()
        self.model.eval()
        shape, home = batch["input_ids"].shape, batch["input_ids"].device
        # Filled on the device and copied back once: a copy per micro-batch would wait for that
        # micro-batch's kernels before the host could queue the next one.
        logp = torch.zeros(shape, dtype=torch.float32, device=self.device)
        ent = torch.zeros(shape, dtype=torch.float32, device=self.device) if with_entropy else None
        mbs = self._microbatches(batch, "forward")
        with self.mb_budget.measure("forward", [mb.n_tokens for mb in mbs]):
            for mb in mbs:
                lp, e, _ = self._token_logprobs(mb, temperature, with_entropy)
                if mb.is_dummy:
                    continue
                width = max(mb.seqlens)
                rows = torch.tensor(mb.indices, device=self.device)
                logp[rows, :width] = packing.unpack(lp, mb, width)
                if with_entropy:
                    ent[rows, :width] = packing.unpack(e, mb, width)
        logp = logp.to(home)
        return (logp, ent.to(home)) if with_entropy else logp

    def train_batch(
        self, batch: Batch, loss_fn: LossFn, loss_weight_fn: Callable[[Batch], float], *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step over this rank's batch.

        loss_fn(logprobs [b, l], entropy [b, l], mb) -> (loss, stats) sees one micro-batch as a
        right-padded sub-batch (same keys as `batch`, on the device). Micro-batch losses are
        combined with weights loss_weight_fn(mb) summed over all data-parallel ranks, so the
        step's gradient is that of the weighted mean over the whole global batch (e.g. weight =
        number of loss tokens gives a token mean). Returns global loss and grad norm, the lr,
        and the loss_fn stats averaged with the same weights (over all ranks).
        """
        import torch.distributed as dist

        self._require_initialized(train=True)
        t0 = time.perf_counter()
        self.model.train()
        mbs = self._microbatches(batch, "train")
        budgets = self._budget_stats()
        subs = [None if mb.is_dummy else self._sub_batch(batch, mb, self.device) for mb in mbs]
        weights = [0.0 if sub is None else float(loss_weight_fn(sub)) for sub in subs]
        total = torch.tensor(sum(weights), dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self._dp_group)
        total = float(total)
        self.optimizer.zero_grad(set_to_none=True)
        if total <= 0:
            logger.warning(
                "train_batch: the loss weights sum to 0 over all ranks (no loss tokens?); skipping the optimizer step"
            )
            return {"loss": 0.0, "grad_norm": 0.0, "lr": self.lr, "skipped": 1.0, **budgets}
        with self.mb_budget.measure("train", [mb.n_tokens for mb in mbs]):
            loss_sum, stat_sums, n_tokens = self._backward_microbatches(mbs, subs, weights, total, loss_fn, temperature)
        grad_norm = clip_grad_norm(self.model.parameters(), self.config.optimizer.gradient_clipping)
        lr = self.lr
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
            skipped = 0.0
        else:
            logger.warning("train_batch: non-finite grad norm %s; skipping the optimizer step", grad_norm)
            skipped = 1.0
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        dist.all_reduce(loss_sum, group=self._dp_group)
        out = {
            "loss": float(loss_sum),
            "grad_norm": grad_norm,
            "lr": lr,
            "skipped": skipped,
            "n_microbatches": float(len(mbs)),
            "n_tokens": float(n_tokens),
            **budgets,
        }
        out.update({f"loss_fn/{k}": v for k, v in self._sum_over_dp(stat_sums).items()})
        out["step_s"] = time.perf_counter() - t0
        return out

    def _budget_stats(self) -> dict[str, float]:
        """This rank's micro-batch token budgets: of the train pass being run (mb_token_budget) and
        of the latest forward pass (mb_token_budget_forward, once there was one)."""
        used = self.mb_budget.used
        out = {"mb_token_budget": float(used["train"])}
        if "forward" in used:
            out["mb_token_budget_forward"] = float(used["forward"])
        return out

    def _backward_microbatches(self, mbs, subs, weights, total: float, loss_fn: LossFn, temperature: float):
        """Forward and backward of each micro-batch, its loss weighted by weight / total; returns
        this rank's weighted loss sum, loss_fn stat sums (tensors) and the tokens it trained on.
        A dummy micro-batch (None) only keeps FSDP's collectives in step."""
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        # Weighted sums stay on the device until the step ends: reading a statistic back per
        # micro-batch (float()) would stall the host until the GPU had finished that micro-batch.
        stat_sums: dict[str, torch.Tensor] = {}
        n_tokens = 0
        for k, (mb, sub, w) in enumerate(zip(mbs, subs, weights)):
            self.model.set_requires_gradient_sync(k == len(mbs) - 1)
            lp, ent, out = self._token_logprobs(mb, temperature)
            if sub is None:
                (out.sum() * 0.0).backward()
                continue
            width = max(mb.seqlens)
            loss, stats = loss_fn(packing.unpack(lp, mb, width), packing.unpack(ent, mb, width), sub)
            # FSDP averages gradients over the dp ranks; multiplying by dp_size turns that into a sum.
            (loss * (w / total) * self.dp_size).backward()
            loss_sum += loss.detach().double() * (w / total)
            n_tokens += mb.n_tokens
            for key, value in stats.items():
                term = torch.as_tensor(value, device=self.device).detach().double() * (w / total)
                stat_sums[key] = stat_sums[key] + term if key in stat_sums else term
        return loss_sum, stat_sums, n_tokens

    def _sum_over_dp(self, values: dict[str, torch.Tensor]) -> dict[str, float]:
        """Sum per-rank weighted stats (0-d tensors) over data-parallel ranks (keys may differ
        between ranks); one read-back for all of them."""
        import torch.distributed as dist

        keys: list[list[str]] = [None] * dist.get_world_size(self._dp_group)  # type: ignore[list-item]
        dist.all_gather_object(keys, sorted(values), group=self._dp_group)
        names = sorted(set().union(*keys))
        if not names:
            return {}
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        vec = torch.stack([values.get(n, zero).to(device=self.device, dtype=torch.float64) for n in names])
        dist.all_reduce(vec, group=self._dp_group)
        return dict(zip(names, vec.tolist()))

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer else 0.0

    # ---- save / load -----------------------------------------------------------------------------
    def save(
        self,
        path: str,
        *,
        with_optimizer: bool = False,
        dtype: str | None = None,
        timer: weight_sync.PhaseTimer | None = None,
    ) -> int:
        """HF folder (model.safetensors in actor.dtype unless dtype is given, config, tokenizer).

        with_optimizer adds `train_state/` (fp32 weights, optimizer, scheduler) for exact
        resumption. Collective; returns the bytes of weights written (on rank 0; 0 elsewhere).
        timer, when given, gets the seconds of "gather" (full tensors) and "transfer" (writing).
        """
        import torch.distributed as dist

        self._require_initialized()
        out = Path(path)
        timer = timer or weight_sync.PhaseTimer()
        tensors = {}
        for name, tensor in timer.iterate(
            "gather",
            state.iter_full_state(
                self.model,
                keep=self.is_rank0,
                dtype=DTYPES[dtype or self.config.dtype],
                lora_scaling=self.lora_scaling,
                tied_lm_head=self.tied_lm_head,
            ),
        ):
            if tensor is not None:
                tensors[name] = tensor
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        with timer.phase("transfer"):
            self._write_hf_folder(out, tensors, dtype)
        if with_optimizer:
            self.save_train_state(str(out / "train_state"))
        dist.barrier()
        return nbytes

    def _write_hf_folder(self, out: Path, tensors: dict[str, torch.Tensor], dtype: str | None) -> None:
        from safetensors.torch import save_file

        if self.is_rank0:
            out.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
            config = self.hf_config.to_dict()
            config.pop("quantization_config", None)
            config["dtype"] = dtype or self.config.dtype
            type(self.hf_config).from_dict(config).save_pretrained(out)
            if self.generation_config is not None:
                self.generation_config.save_pretrained(out)
            self.tokenizer.save_pretrained(out)

    def load(self, path: str, *, with_optimizer: bool = False) -> None:
        """Inverse of save: train_state/ when with_optimizer (exact), else the HF weights."""
        import torch.distributed as dist

        self._require_initialized()
        if with_optimizer:
            self.load_train_state(str(Path(path) / "train_state"))
            return
        if self.config.use_lora:
            raise ValueError(
                "a saved HF folder holds merged LoRA weights; loading it into a LoRA "
                "engine would apply the adapters twice. Use load(path, with_optimizer=True) "
                "or start a new engine with actor.path set to the folder"
            )
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        hf = load_file(str(Path(path) / "model.safetensors"))
        full = {k: v.float() for k, v in state.to_model_names(hf, self.model).items()}
        if self.tied_lm_head:
            full.pop("lm_head.weight", None)
        result = set_model_state_dict(self.model, full, options=StateDictOptions(full_state_dict=True, strict=False))
        missing = [k for k in result.missing_keys if not (self.tied_lm_head and k == "lm_head.weight")]
        if missing:
            raise ValueError(f"{path} lacks weights for {missing[:5]}; it is not a checkpoint of this model")
        dist.barrier()

    def save_train_state(self, path: str) -> None:
        """Sharded fp32 weights + optimizer (torch.distributed.checkpoint) and the LR schedule."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self._require_initialized(train=True)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        if self.is_rank0:
            torch.save({"scheduler": self.scheduler.state_dict()}, Path(path) / "engine.pt")
        dist.barrier()

    def load_train_state(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        self._require_initialized(train=True)
        if not (Path(path) / "engine.pt").exists():
            raise FileNotFoundError(
                f"{path} is not a train state (no engine.pt); save it with "
                "save(..., with_optimizer=True) or save_train_state"
            )
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        sd = {"model": model_sd, "optim": optim_sd}
        dcp.load(sd, checkpoint_id=path)
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        extra = torch.load(Path(path) / "engine.pt", weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])

    # ---- weight updates -------------------------------------------------------------------------
    def weight_update_path(self, version: int) -> str:
        return weight_sync.disk_update_path(self.fileroot, self.experiment_name, self.trial_name, version)

    def update_weights(self, meta: WeightUpdateMeta, sink: WeightSink | None) -> dict[str, float]:
        """Push the current weights into `sink` as version meta.version (collective).

        `sink` on rank 0: the open WeightSink of the servers' control (`with
        control.weight_update(meta) as sink`), which pauses, flushes and continues the servers;
        None on the other ranks, which only take part in the gathers. This engine only produces
        the weights. disk: rank 0 saves the HF folder (meta.path or weight_update_path(version))
        and the servers load it. distributed and tensor: full tensors, bucket by bucket (the sink
        broadcasts them, or hands them over as CUDA IPC handles; shared memory on CPU).
        Returns seconds and bytes, and the seconds of its phases (weight_update/gather_s,
        transfer_s, ...: see UpdateStats).
        """
        import torch.distributed as dist

        self._require_initialized()
        if meta.version is None:
            raise ValueError("update_weights needs the version the servers report after it: WeightUpdateMeta.version")
        if self.is_rank0 and sink is None:
            raise ValueError("update_weights on rank 0 needs an open sink: `with control.weight_update(meta) as sink`")
        t0 = time.perf_counter()
        timer = weight_sync.PhaseTimer(sync=torch.cuda.synchronize if self.device_type == "cuda" else None)
        if meta.type == "disk":
            nbytes = self._update_from_disk(meta, sink, timer)
        elif meta.type in ("distributed", "tensor"):
            nbytes = self._update_in_buckets(meta, sink, timer)
        else:
            raise ValueError(
                f"weight update type {meta.type!r} is not 'disk', 'distributed' or 'tensor' (actor.weight_update)"
            )
        dist.barrier()
        stats = weight_sync.UpdateStats(time.perf_counter() - t0, nbytes, meta.version, meta.type, timer.seconds)
        if self.is_rank0:
            logger.info(
                "weight update v%d (%s): %.2f s, %.1f MB", meta.version, meta.type, stats.seconds, nbytes / 2**20
            )
        return stats.as_dict()

    def _update_from_disk(self, meta: WeightUpdateMeta, sink: WeightSink | None, timer: weight_sync.PhaseTimer) -> int:
        if self.config.use_lora and self.config.lora_push == "adapter":
            return self._push_adapter(meta, sink, timer)
        path = meta.path or self.weight_update_path(meta.version)
        nbytes = self.save(path, timer=timer)
        if self.is_rank0:
            with timer.phase("load"):
                sink.load_disk(path)
            self._prune_disk_updates(path, meta.version)
        return nbytes

    def _prune_disk_updates(self, path: str, version: int) -> None:
        """Old versions' folders go once the servers serve `version`; only in the run's own
        weight_update/ folder (a meta.path chosen by the caller is left alone)."""
        if path == self.weight_update_path(version):
            weight_sync.prune_disk_updates(Path(path).parent, version)

    def _push_adapter(self, meta: WeightUpdateMeta, sink: WeightSink | None, timer: weight_sync.PhaseTimer) -> int:
        """lora_push=adapter: write a peft adapter folder; servers load it as LoRA `v{version}`
        through SGLang's /load_lora_adapter route and report `version`; the previous adapter is
        unloaded, and later /generate requests name `v{version}` in lora_path."""
        import torch.distributed as dist
        from safetensors.torch import save_file

        path = meta.path or self.weight_update_path(meta.version)
        tensors = {k: v for k, v in state.iter_adapter_state(self.model, keep=self.is_rank0) if v is not None}
        if self.is_rank0:
            Path(path).mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(Path(path) / "adapter_model.safetensors"), metadata={"format": "pt"})
            self.model.peft_config["default"].save_pretrained(path)
            with timer.phase("load"):
                sink.load_adapter(path, f"v{meta.version}")
            self._prune_disk_updates(path, meta.version)
        dist.barrier()
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def _update_in_buckets(self, meta: WeightUpdateMeta, sink: WeightSink | None, timer: weight_sync.PhaseTimer) -> int:
        """Distributed (broadcast) and tensor (IPC handles) updates: full tensors, bucket by bucket,
        all pushed into the one sink (generation stays paused across the buckets)."""
        # NCCL broadcasts and IPC handles leave full tensors on the GPU (no host round trip)
        on_device = meta.type == "tensor" or meta.backend == "nccl"
        named = state.iter_full_state(
            self.model,
            keep=self.is_rank0,
            dtype=self.param_dtype,
            lora_scaling=self.lora_scaling,
            tied_lm_head=self.tied_lm_head,
            to_cpu=not on_device,
        )
        nbytes = 0
        bucket_bytes = self.config.weight_update_bucket_mb * 2**20
        for bucket in timer.iterate("gather", weight_sync.buckets(named, bucket_bytes)):
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket if t is not None)
            if self.is_rank0:
                with timer.phase("transfer"):
                    sink.load_bucket(bucket)
        return nbytes

    # ---- offload (colocated, time-shared runs) ----------------------------------------------------
    def offload(self) -> dict[str, float]:
        """Move parameters and optimizer state to CPU memory (gradients are dropped: every
        training step starts from none) and return the freed device cache to the driver, so a
        server on this device can generate with the memory (actor.offload). Returns seconds."""
        return self._move_state("cpu")

    def onload(self) -> dict[str, float]:
        """Bring what offload() moved back to this process's device, for training."""
        return self._move_state(self.device)

    def _move_state(self, device) -> dict[str, float]:
        self._require_initialized()
        t0 = time.perf_counter()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.model.to(device)  # FSDP2 moves each rank's shards (DTensor parameters)
        if self.optimizer is not None:
            # Adam keeps its step count on the CPU, except fused or capturable, where it must be on
            # the parameters' device: a checkpoint loaded while offloaded put it on the CPU, and the
            # fused kernel then refused it (found by a GPU chaos trial's relaunch, 2026-12-05)
            step_follows = any(g.get("fused") or g.get("capturable") for g in self.optimizer.param_groups)
            for per_param in self.optimizer.state.values():
                for key, value in per_param.items():
                    if key == "step" and not step_follows:
                        continue
                    if isinstance(value, torch.Tensor) and value.device != torch.device(device):
                        per_param[key] = value.to(device, non_blocking=True)
        if self.device_type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.offloaded = torch.device(device).type == "cpu" and self.device_type != "cpu"
        return {"seconds": time.perf_counter() - t0}

    # ---- teardown --------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Free the model and optimizer; tear down groups this engine created (not the caller's)."""
        import gc

        import torch.distributed as dist

        self.model = self.optimizer = self.scheduler = None
        self.mesh = self._dp_group = None  # they name groups that end below
        # FSDP's modules sit in reference cycles: collect them now, so that the parameters' memory is
        # free when destroy returns, not at some later collection or in the interpreter's teardown
        gc.collect()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_process_group = False

    def _require_initialized(self, train: bool = False) -> None:
        if self.model is None:
            raise RuntimeError("FSDPEngine is not initialized; call engine.initialize() first")
        if train and self.optimizer is None:
            raise RuntimeError("this FSDPEngine was built with trainable=False (a reference model); it cannot train")


def _per_sequence(value: Any, n: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n


def _keeps_logit_rows(model) -> bool:
    """Whether the model's forward takes logits_to_keep (transformers' causal LMs: an int keeps the
    last rows, a tensor the rows it names)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing of every decoder layer (the API was renamed in
    transformers 5: activation_checkpointing_enable; older versions: gradient_checkpointing_enable)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _share_prompts(cfg, attn: str, device_type: str) -> bool:
    """Whether passes compute each shared prompt once. actor.share_prompts 'auto' turns it on on CUDA
    wherever it applies (on CPU the grouping and the per-segment attention cost more than the prompt
    tokens they save on small models: the 150-step CPU demo took 125 s against 109 s); true where it
    cannot apply is refused."""
    blocker = None
    if attn != "areal_packed_sdpa":
        blocker = f"the engine's packed attention (areal_packed_sdpa), not attn_implementation={attn!r}"
    elif cfg.logprobs_on_every_token:
        blocker = "logprobs on loss tokens only, not actor.logprobs_on_every_token=true"
    if cfg.share_prompts is True and blocker:
        raise ValueError(
            f"actor.share_prompts=true needs {blocker}: set actor.share_prompts to auto (on where it "
            "applies) or false, or leave the attention and actor.logprobs_on_every_token at their defaults"
        )
    if cfg.share_prompts != "auto":
        return bool(cfg.share_prompts)
    if blocker and device_type == "cuda":  # say why, so a user of another attention knows what the trainer skips
        logger.info("actor.share_prompts=auto: each sequence computed whole; sharing needs %s", blocker)
    return blocker is None and device_type == "cuda"


def _default_attention(device_type: str) -> str:
    """flash-attention's varlen kernel when installed on GPU, else causal SDPA per packed sequence."""
    if device_type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    from .attention import register

    return register()
