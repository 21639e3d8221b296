"""Device memory of the built-in server: the KV-cache budget, memory readings, release and resume.

Budget (--mem-fraction-static, --max-total-tokens). As in SGLang, the fraction is the share of
the device's memory for the weights plus the KV cache. The server has no preallocated pool, so
the share is kept in two ways:

* On CUDA the process is capped at that share (torch.cuda.set_per_process_memory_fraction): an
  allocation past it fails in this process instead of taking a colocated trainer's memory.
* So that the cap is never hit, the scheduler admits a sequence only while the worst-case KV
  cache of the running batch fits a token budget, `max_total_num_tokens` (SGLang's name):
      (fraction x device memory - weights - headroom) / cost of one token,
  one token costing layers x kv heads x head dim x 2 (keys, values) x dtype bytes, times
  (layers + 1) / layers because the cache is reallocated one layer at a time (engine.py). The
  batch is left-padded, so a batch's worst case is rows x the longest row's prompt +
  max_new_tokens (`kv_footprint`); decode steps never allocate past that width. The headroom is
  256 MiB plus the largest prefill's activations and freshly built cache (max(--max-prefill-
  tokens, context length) tokens) plus float32 logits of every running row while sampling.
  On CPU the same arithmetic runs against the machine's RAM (psutil), without a cap.
  --max-total-tokens lowers the budget (SGLang's flag: a debugging cap on the pool).

Release and resume (/release_memory_occupation, /resume_memory_occupation; tags "kv_cache" and
"weights", none meaning both). Like SGLang, release needs an idle server: no running request and
none queued, requests held by a pause included (SGLang asserts on them); otherwise it is a 400
telling the caller to pause with mode abort or let the requests finish. Then:
* kv_cache: with nothing running no cache is left; admission stops until resume;
* weights: every parameter and buffer moves to CPU memory (pinned, when CUDA is there) and the
  module keeps an empty placeholder on the device; resume copies them back unchanged;
* the CUDA allocator's free blocks (cuBLAS workspaces too) go back to the device.
While anything is released, /generate is a 400 naming /resume_memory_occupation, and /health and
/health_generate answer 200. Weight updates write into the CPU copies, which resume brings back
(so a trainer may update before or after resuming); LoRA loads need the weights on the device
(400). Releasing what is released changes nothing and says so; resuming what is not released is
a 400 that names it, because SGLang's scheduler dies on it (KeyError in
weight_updater.resume_memory_occupation, 0.5.16), and no caller should find that out on a GPU. The
routes work with or without --enable-memory-saver. On a CPU server the weights have nowhere else
to go: the model holds placeholders while the tensors wait in RAM, so only the bookkeeping and the
refusals are the same.
"""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import asdict, dataclass

from areal.server.args import DEFAULT_MEM_FRACTION

logger = logging.getLogger("areal.server")

FIXED_HEADROOM_BYTES = 256 * 2**20  # allocator slack, small temporaries
SAMPLING_COPIES = 4  # float32 logits per row while sampling: logits, softmax, sort, cumsum
GIB = 2**30


class MemoryBudgetError(ValueError):
    """The weights and headroom do not fit the memory share; names the flag and the fix."""


class MemoryReleased(ValueError):
    """A request needs memory that /release_memory_occupation gave back."""


class ServerBusy(ValueError):
    """Release asked while requests hold or wait for the KV cache."""


class NotReleased(ValueError):
    """Resume asked for memory that is not released (SGLang's scheduler exits on it)."""


class DeviceMemoryShort(ValueError):
    """Resume found too little free device memory (a colocated process still holds it)."""


def released_message(where: str, released) -> str:
    tags = sorted(released)
    return (
        f"{where}: the server's {' and '.join(tags)} memory is released "
        f"(/release_memory_occupation); call /resume_memory_occupation "
        f"(tags {tags} or null) first, then send the request again."
    )


# ---- the budget -------------------------------------------------------------------------------
def kv_bytes_per_token(config, dtype) -> int:
    """Bytes of keys and values one token takes in every layer's cache."""
    text = config.get_text_config(decoder=True)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    return int(text.num_hidden_layers) * kv_heads * head_dim * 2 * dtype.itemsize


def kv_footprint(rows: int, width: int) -> int:
    """Token slots of a left-padded batch of `rows` sequences whose longest ends at `width`."""
    return rows * width


def final_length(seq) -> int:
    """A sequence's length when it ends at max_new_tokens: its worst case in the cache."""
    return len(seq.input_ids) + seq.params.max_new_tokens


def resident_bytes(model) -> int:
    """Bytes of the model's parameters and buffers (tied ones once)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def device_total_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def headroom_bytes(config, dtype, *, prefill_tokens: int, max_running: int, vocab_size: int) -> int:
    """Memory outside the KV cache that a step needs at its peak: the largest prefill's
    activations (hidden states, attention and MLP temporaries) and the cache that prefill builds
    before it joins the batch, plus float32 logits of every row while sampling."""
    text = config.get_text_config(decoder=True)
    hidden = int(text.hidden_size)
    intermediate = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    per_prefill_token = (4 * hidden + 3 * intermediate) * dtype.itemsize + kv_bytes_per_token(config, dtype)
    sampling = max_running * vocab_size * 4 * SAMPLING_COPIES
    return FIXED_HEADROOM_BYTES + prefill_tokens * per_prefill_token + sampling


@dataclass(frozen=True)
class KVBudget:
    """How `max_total_num_tokens` was reached (reported in /get_server_info)."""

    max_total_num_tokens: int
    bytes_per_token: int
    mem_fraction_static: float
    device_total_bytes: int
    weights_bytes: int
    headroom_bytes: int
    limited_by: str  # "--mem-fraction-static" or "--max-total-tokens"

    def as_dict(self) -> dict:
        return asdict(self)


def plan_kv_budget(
    runner,
    *,
    mem_fraction: float | None,
    max_total_tokens: int | None,
    max_prefill_tokens: int,
    context_length: int,
    max_running: int,
) -> KVBudget:
    """The token budget for this model on this device (see the module docstring)."""
    fraction = DEFAULT_MEM_FRACTION if mem_fraction is None else mem_fraction
    config, dtype = runner.config, runner.dtype
    layers = int(config.get_text_config(decoder=True).num_hidden_layers)
    per_token = kv_bytes_per_token(config, dtype)
    total = device_total_bytes(runner.device)
    weights = resident_bytes(runner.model)
    headroom = headroom_bytes(
        config,
        dtype,
        prefill_tokens=max(max_prefill_tokens, context_length),
        max_running=max_running,
        vocab_size=runner.vocab_size,
    )
    free = fraction * total - weights - headroom
    tokens = int(free * layers // (per_token * (layers + 1))) if free > 0 else 0
    if tokens <= 0:
        where = "GPU" if runner.device.type == "cuda" else "RAM"
        default = " (the default)" if mem_fraction is None else ""
        raise MemoryBudgetError(
            f"--mem-fraction-static {fraction}{default}: {fraction} x {total / GIB:.2f} GiB of "
            f"{where} leaves no room for a KV cache after the weights ({weights / GIB:.2f} GiB) "
            f"and the activation headroom ({headroom / GIB:.2f} GiB). Raise --mem-fraction-static, "
            "lower --max-prefill-tokens or --max-running-requests, or use a smaller --dtype."
        )
    limited_by = "--mem-fraction-static"
    if max_total_tokens is not None:
        if max_total_tokens > tokens:
            logger.warning(
                "--max-total-tokens %d is more than the memory allows (%d tokens at "
                "--mem-fraction-static %s); using %d",
                max_total_tokens,
                tokens,
                fraction,
                tokens,
            )
        else:
            tokens, limited_by = max_total_tokens, "--max-total-tokens"
    return KVBudget(tokens, per_token, fraction, total, weights, headroom, limited_by)


def cap_process_memory(device, fraction: float) -> None:
    """On CUDA, make allocations past `fraction` of the device fail in this process."""
    import torch

    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(float(fraction), index)


# ---- readings ---------------------------------------------------------------------------------
def memory_readings(device) -> dict:
    """This process's memory now: the CUDA allocator's counters on CUDA, RSS everywhere."""
    import psutil
    import torch

    try:
        rss = int(psutil.Process().memory_info().rss)
    except OSError:  # reading /proc takes a descriptor: a server out of them still reports its load
        rss = None
    out = {
        "device": str(device),
        "rss_bytes": rss,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if device.type == "cuda":
        out.update(
            allocated_bytes=torch.cuda.memory_allocated(device),
            reserved_bytes=torch.cuda.memory_reserved(device),
            max_allocated_bytes=torch.cuda.max_memory_allocated(device),
            max_reserved_bytes=torch.cuda.max_memory_reserved(device),
        )
    return out


# ---- release and resume -----------------------------------------------------------------------
class WeightOffloader:
    """Moves the model's parameters and buffers to CPU memory and back (worker thread only).
    Both directions copy everything first and only then swap, so a failed copy (out of memory)
    leaves the model as it was."""

    def __init__(self, runner):
        self.runner = runner
        self._moved: list[tuple] = []  # (module, "_parameters" | "_buffers", name, tensor, host)
        self._host: dict[int, object] = {}  # id(parameter or buffer placeholder) -> CPU copy

    @property
    def released(self) -> bool:
        return bool(self._moved)

    def host_copy(self, tensor):
        """The CPU copy standing for `tensor` (a parameter or buffer) while released."""
        return self._host[id(tensor)]

    def offloaded_bytes(self) -> int:
        unique = {id(t): t for t in self._host.values()}
        return sum(t.numel() * t.element_size() for t in unique.values())

    def release(self) -> None:
        import torch

        copies: dict[int, object] = {}  # by id of the device tensor: tied weights stay tied
        moved = []
        with torch.no_grad():
            for module, kind, name, tensor in _module_tensors(self.runner.model):
                if id(tensor) not in copies:
                    copies[id(tensor)] = _to_host(tensor.data)
                moved.append((module, kind, name, tensor, copies[id(tensor)]))
        device = self.runner.device
        placeholders: dict[int, object] = {}
        for module, kind, name, tensor, host in moved:
            if kind == "_parameters":
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=device)
                self._host[id(tensor)] = host
            else:
                if id(tensor) not in placeholders:
                    placeholders[id(tensor)] = torch.empty(0, dtype=tensor.dtype, device=device)
                module._buffers[name] = placeholders[id(tensor)]
                self._host[id(placeholders[id(tensor)])] = host
        self._moved = moved

    def resume(self) -> None:
        import torch

        device = self.runner.device
        back: dict[int, object] = {}  # by id of the CPU copy: tied weights stay tied
        for *_, host in self._moved:
            if id(host) not in back:
                back[id(host)] = host if host.device == device else host.to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for module, kind, name, tensor, host in self._moved:
            if kind == "_parameters":
                tensor.data = back[id(host)]
            else:
                module._buffers[name] = back[id(host)]
        self._moved, self._host = [], {}
        if device.type == "cuda":  # pinned copies go back to the OS, not to torch's host cache
            getattr(torch._C, "_host_emptyCache", lambda: None)()


def _module_tensors(model):
    """(module, kind, name, tensor) for every parameter and buffer slot of every module."""
    for module in model.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, kind).items():
                if tensor is not None:
                    yield module, kind, name, tensor


def _to_host(tensor):
    """A CPU copy (pinned when CUDA is there, for fast copies back); on CPU the tensor itself."""
    import torch

    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor)
    return host


class MemoryOccupation:
    """State of /release_memory_occupation and /resume_memory_occupation (worker thread)."""

    def __init__(self, scheduler, offloader: WeightOffloader):
        self.scheduler = scheduler
        self.offloader = offloader

    @property
    def released(self) -> frozenset:
        return self.scheduler.memory_released

    def release(self, tags: list[str]) -> dict:
        t0 = time.perf_counter()
        new = [t for t in tags if t not in self.released]
        if new:
            self.scheduler.check_idle_for_release()
            if "weights" in new:
                self.offloader.release()
            self.scheduler.memory_released = self.released | set(new)
            _empty_device_cache(self.offloader.runner.device)
            logger.info("memory released: %s", new)
        return self._reply("Released", new, tags, time.perf_counter() - t0)

    def resume(self, tags: list[str]) -> dict:
        import torch

        t0 = time.perf_counter()
        resident = [t for t in tags if t not in self.released]
        if resident:
            raise NotReleased(
                f"/resume_memory_occupation: {', '.join(resident)} {'is' if len(resident) == 1 else 'are'} not "
                f"released (released: {sorted(self.released) or 'nothing'}); SGLang's scheduler exits on "
                "such a resume (KeyError), so resume only the tags /release_memory_occupation released"
            )
        if "weights" in tags:
            try:
                self.offloader.resume()
            except torch.OutOfMemoryError as exc:
                _empty_device_cache(self.offloader.runner.device)
                raise DeviceMemoryShort(
                    f"/resume_memory_occupation: the weights do not fit on the device now "
                    f"({str(exc).splitlines()[0]}); nothing was resumed. Free device memory in "
                    "the colocated process (the trainer) first, then call again."
                ) from None
        self.scheduler.memory_released = self.released - set(tags)
        if tags:
            logger.info("memory resumed: %s", tags)
        return self._reply("Resumed", tags, tags, time.perf_counter() - t0)

    def _reply(self, verb: str, changed: list[str], asked: list[str], seconds: float) -> dict:
        unchanged = [t for t in asked if t not in changed]
        state = "released" if verb == "Released" else "resident"
        parts = [f"{verb} {', '.join(changed)}."] if changed else []
        if unchanged:
            parts.append(f"{', '.join(unchanged)} already {state}: nothing to do.")
        return {
            "success": True,
            "message": " ".join(parts),
            "changed": changed,
            "released": sorted(self.released),
            "seconds": seconds,
        }


def _empty_device_cache(device) -> None:
    """Give the CUDA allocator's free blocks back to the device, cuBLAS's workspaces too (they
    are allocator blocks that empty_cache keeps; cuBLAS makes new ones on its next call)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
        torch.cuda.empty_cache()
