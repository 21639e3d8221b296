"""The model side of the server: load a transformers causal LM and run batched forward passes.

The scheduler keeps every running sequence in one left-padded batch with a shared KV cache
(`KVBatch`). New sequences are prefilled together, then merged into the running batch by
left-padding the shorter cache; finished sequences are dropped by selecting batch rows, and
columns that became padding for every row are trimmed. Each decode step then feeds one token per
sequence. Padded key/value slots are zeroed and masked, so a sequence's numbers do not depend on
its neighbours (greedy output matches `transformers.generate` in float32).

Decode steps write in place: the cache tensors are views of buffers with spare columns
(`SPARE_COLUMNS`), so a step fills one column instead of concatenating. Concatenation (what
transformers' DynamicCache does) copied the whole cache twice per step and allocated ~100
slightly larger blocks each time, which fragmented the CUDA allocator until it filled the GPU.

Only this module and `weights.py` touch the model; both run on the scheduler's worker thread.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass

logger = logging.getLogger("areal.server")

DTYPE_NAMES = {"bfloat16", "float16", "float32"}


def torch_dtype(name: str):
    """Map a dtype name (bfloat16/float16/float32) to torch; others are a user error."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r} is not supported; use one of {sorted(DTYPE_NAMES)}.")
    return getattr(torch, name)


SPARE_COLUMNS = 64  # decode steps between two reallocations of the cache


@dataclass
class KVBatch:
    """Left-padded KV cache of the running sequences.

    layers: per decoder layer, (keys, values) of shape [B, H_kv, L, D];
    mask: [B, L] long, 1 for real tokens;
    lengths: real tokens in the cache per row (position id of the next token).
    """

    layers: list
    mask: object
    lengths: object
    spare: int = 0  # columns allocated past mask.shape[1] in every layer's buffers

    def reserve(self, columns: int = 1, max_width: int | None = None) -> None:
        """Make sure `columns` more columns can be written in place (reallocates, with slack up
        to `max_width` columns in all: the longest row's worst case, which the scheduler's KV
        budget counts). One layer at a time, so the old and new buffers of only one layer
        coexist (memory.py counts that transient)."""
        if self.spare >= columns:
            return
        width = self.mask.shape[1]
        extra = max(columns, SPARE_COLUMNS)
        if max_width is not None:
            extra = max(columns, min(extra, max_width - width))
        for i, (k, v) in enumerate(self.layers):
            kb = k.new_empty(k.shape[:2] + (width + extra,) + k.shape[3:])
            vb = v.new_empty(kb.shape)
            kb[:, :, :width].copy_(k)
            vb[:, :, :width].copy_(v)
            self.layers[i] = (kb[:, :, :width], vb[:, :, :width])
            del k, v
        self.spare = extra

    def nbytes(self) -> int:
        """Bytes of the cache buffers (spare columns included)."""
        return sum(t.untyped_storage().nbytes() for layer in list(self.layers) for t in layer)

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    def select(self, rows: list[int]) -> "KVBatch | None":
        """Keep `rows` (in that order); trims columns that are padding for every kept row.
        Consumes this batch, one layer at a time, so that at most one layer exists twice."""
        import torch

        if not rows:
            return None
        idx = torch.tensor(rows, device=self.mask.device)
        mask = self.mask.index_select(0, idx)
        start = int((mask.sum(0) > 0).nonzero()[0]) if mask.any() else mask.shape[1]
        layers = []
        while self.layers:
            k, v = self.layers.pop(0)
            layers.append((k.index_select(0, idx)[:, :, start:], v.index_select(0, idx)[:, :, start:]))
            del k, v
        return KVBatch(layers, mask[:, start:], self.lengths.index_select(0, idx))

    @staticmethod
    def merge(a: "KVBatch | None", b: "KVBatch | None") -> "KVBatch | None":
        """Concatenate two batches along the batch dim, left-padding the shorter cache with
        zeros. Consumes both, one layer at a time (at most one layer exists twice)."""
        if a is None or b is None:
            return a or b
        import torch
        import torch.nn.functional as F

        width = max(a.mask.shape[1], b.mask.shape[1])
        wa, wb, na = a.mask.shape[1], b.mask.shape[1], a.size
        layers = []
        while a.layers:
            pair = []
            for ta, tb in zip(a.layers.pop(0), b.layers.pop(0)):
                out = ta.new_zeros((na + tb.shape[0],) + ta.shape[1:2] + (width,) + ta.shape[3:])
                out[:na, :, width - wa :].copy_(ta)
                out[na:, :, width - wb :].copy_(tb)
                pair.append(out)
                del ta, tb
            layers.append(tuple(pair))
        mask = torch.cat([F.pad(a.mask, (width - wa, 0)), F.pad(b.mask, (width - wb, 0))])
        return KVBatch(layers, mask, torch.cat([a.lengths, b.lengths]))


class ModelRunner:
    """Owns the model and runs prefill / decode forward passes (worker thread only)."""

    def __init__(self, model_path: str, dtype: str = "auto", device: str = "auto", seed: int = 0):
        import torch

        self.device = torch.device(_resolve_device(device))
        if self.device.type == "cuda":
            # cuDNN's SDPA builds an execution plan per new shape (~70 ms on an H200 seen here);
            # the KV length changes every decode step, so that cost hits every step.
            torch.backends.cuda.enable_cudnn_sdp(False)
        self.model = load_model(model_path, dtype, self.device)
        self.config = self.model.config
        self.dtype = next(self.model.parameters()).dtype
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # transformers >= 5.2x renamed forward's `past_key_values` to `cache`.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        _check_full_attention(self.config)

    def eos_token_ids(self) -> set[int]:
        """EOS ids from config and generation_config (either may hold an int or a list)."""
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (self.config, gen):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            if eos is not None:
                ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
        return {int(i) for i in ids}

    def prefill(self, prompts: list[list[int]]):
        """Run the prompts (left-padded) through the model; returns (KVBatch, last logits [N, V])."""
        import torch
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        pad = 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.config)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: cache},
            )
            keep = mask.to(self.dtype)[:, None, :, None]
            for layer in cache.layers:  # in place: no second copy of the new cache
                layer.keys.mul_(keep)
                layer.values.mul_(keep)
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        lengths = mask.sum(-1)
        return KVBatch(layers, mask, lengths), out.logits[:, -1, :]

    def decode(self, batch: KVBatch, tokens: list[int], max_width: int | None = None):
        """Feed one token per row; extends `batch` in place and returns logits [B, V].
        `max_width` (optional) caps the cache's spare columns (see KVBatch.reserve)."""
        import torch

        ids = torch.tensor(tokens, device=self.device).unsqueeze(1)
        mask = torch.cat([batch.mask, batch.mask.new_ones(batch.size, 1)], dim=1)
        batch.reserve(1, max_width)
        cache = self._cache_over(batch.layers)
        with torch.inference_mode():
            # A 4-D mask is used as given (no mask building per step); see server/attention.py.
            out = self.model(
                input_ids=ids,
                attention_mask=mask.bool()[:, None, None, :],
                position_ids=batch.lengths.unsqueeze(1),
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
        batch.layers = [(layer.keys, layer.values) for layer in cache.layers]
        batch.spare -= 1
        batch.mask = mask
        batch.lengths = batch.lengths + 1
        return out.logits[:, -1, :]

    def _cache_over(self, layers: list):
        """A DynamicCache whose layers hold `layers`' tensors as they are (no copy) and append
        in place into their spare columns."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        layer = in_place_layer_class()
        cache.layers = [layer.over(k, v) for k, v in layers]
        return cache


@functools.cache
def in_place_layer_class():
    """transformers' DynamicLayer, but `update` writes into the spare columns of the buffer that
    `keys`/`values` are views of (KVBatch.reserve made room) instead of concatenating. Built on
    first use: importing this module stays free of torch and transformers."""
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        @classmethod
        def over(cls, keys, values) -> "InPlaceLayer":
            layer = cls()
            layer.dtype, layer.device = keys.dtype, keys.device
            layer.keys, layer.values = keys, values
            layer.is_initialized = True
            return layer

        def update(self, key_states, value_states, *args, **kwargs):
            self.keys = _append_in_place(self.keys, key_states)
            self.values = _append_in_place(self.values, value_states)
            return self.keys, self.values

    return InPlaceLayer


def _append_in_place(cache, new):
    """Write `new` [B, H, n, D] into the columns after `cache` [B, H, L, D] (a view of a wider
    buffer) and return the view of the first L + n columns."""
    import torch

    width, n = cache.shape[2], new.shape[2]
    wider = torch.as_strided(
        cache, cache.shape[:2] + (width + n,) + cache.shape[3:], cache.stride(), cache.storage_offset()
    )
    wider[:, :, width:].copy_(new)
    return wider


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but CUDA is not available; use --device cpu.")
    return device


def _check_full_attention(config) -> None:
    """The padded shared cache assumes full attention in every layer (no sliding windows)."""
    text_config = config.get_text_config(decoder=True)
    kinds = set(getattr(text_config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(
            f"--model-path: layer types {sorted(kinds)} are not supported by the "
            "built-in server (full attention only); serve this model with SGLang."
        )


def load_model(model_path: str, dtype: str, device):
    """from_pretrained in eval mode with SDPA attention (grouped-query decode steps, see
    server/attention.py); dtype 'auto' keeps the checkpoint's."""
    from transformers import AutoModelForCausalLM

    from areal.models.resolve import model_load_error
    from areal.server.attention import register

    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_path, attn_implementation=register(), dtype="auto" if dtype == "auto" else torch_dtype(dtype)
        )
    except Exception as exc:  # OSError, JSON, safetensors' own SafetensorError, ...
        raise ModelLoadError(model_load_error("--model-path", model_path, exc)) from exc
    return model.to(device).eval()


class ModelLoadError(ValueError):
    """The model folder does not load; the message names the flag, the path and the fix."""
