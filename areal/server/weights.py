"""Weight updates: from a checkpoint folder, broadcast from the trainer over torch.distributed, or
handed over as tensors shared with the trainer (CUDA IPC handles or CPU shared memory).

Distributed protocol (SGLang's, which the trainer side follows):
  1. POST /init_weights_update_group {master_address, master_port, rank_offset, world_size,
     group_name, backend}: trainer rank 0 and every server join one process group; this server
     takes rank `rank_offset` (it runs one rank: tp 1). The group is a separate, named group
     (not the default one), built on a TCPStore at master_address:master_port, so a trainer that
     already has its own default group can create it too: see `init_custom_process_group`,
     which the trainer side can call with rank 0.
  2. POST /update_weights_from_distributed {names, dtypes, shapes, ...}: for each name, in order,
     rank 0 broadcasts a tensor of that dtype and shape; the server receives all of them, then
     copies them into the model's parameters (names are Hugging Face state-dict names).
  3. POST /destroy_weights_update_group {group_name}.
Backends: nccl on GPU, gloo on CPU.

Tensor protocol (SGLang's /update_weights_from_tensor, for a trainer on the same machine):
`serialized_named_tensors` holds one text per tensor-parallel rank, each a pickled list of
(name, tensor) pairs (areal/utils/tensor_ipc.py: CUDA tensors by IPC handle, CPU tensors by
shared-memory file name). This server runs one rank, so the list has exactly one entry. It is read
with an allow-list unpickler, every name and shape is checked, then the tensors are copied into
the parameters of those Hugging Face state-dict names (a subset is fine: updates may come in
buckets).

While the weights are released (/release_memory_occupation, memory.py) every update writes into
their CPU copies; resume brings the updated weights back.

Disk loads are limited to allowed folders (`weight_roots`): the model's own folder plus
--weight-dirs (the launcher passes the run's weight_update/, checkpoints/ and models/ folders), or,
without --weight-dirs, the default run root. A path is checked after resolving '..' and symlinks,
so a link inside an allowed folder that points elsewhere is refused too.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from areal.server.engine import torch_dtype
from areal.server.lora import LoraAdapters
from areal.server.validation import Forbidden
from areal.utils.dist_group import init_custom_process_group

logger = logging.getLogger("areal.server")


def weight_roots(model_path: str, weight_dirs: list[str] | None) -> list[str]:
    """Folders disk weight loads may come from (see the module docstring)."""
    from areal.server.args import default_run_root

    roots = list(weight_dirs) if weight_dirs else [default_run_root()]
    if Path(model_path).is_dir():  # a hub id has no folder of its own
        roots.insert(0, str(model_path))
    return roots


def check_weight_path(path: str, roots: list[str], where: str, key: str = "model_path") -> None:
    """Raise Forbidden unless `path`, resolved, lies inside one of `roots` (resolved now)."""
    resolved = Path(path).expanduser().resolve()
    if any(resolved.is_relative_to(Path(r).expanduser().resolve()) for r in roots):
        return
    shown = f"{path!r}" + ("" if str(resolved) == path else f" (resolves to {resolved})")
    raise Forbidden(
        f"{where}: {key} {shown} is outside the folders this server may load "
        f"weights from: {roots}. Save the weights under one of them, or start the "
        "server with --weight-dirs covering that folder (launcher config: "
        "sglang.weight_dirs; '/' allows any path)."
    )


class WeightUpdater:
    """Applies weight updates to a ModelRunner's model (called on the worker thread)."""

    def __init__(self, runner, offloader=None):
        self.runner = runner
        self.offloader = offloader  # memory.WeightOffloader: where released weights are
        self.groups: dict[str, object] = {}
        self.lora = LoraAdapters(runner)  # /load_lora_adapter; see lora.py

    @property
    def weights_released(self) -> bool:
        return self.offloader is not None and self.offloader.released

    def parameters(self) -> dict:
        """Name -> tensor for every parameter and buffer, tied duplicates included; while the
        weights are released, their CPU copies (updates land there)."""
        model = self.runner.model
        named = dict(model.named_parameters(remove_duplicate=False))
        named.update(dict(model.named_buffers(remove_duplicate=False)))
        if self.weights_released:
            named = {name: self.offloader.host_copy(t) for name, t in named.items()}
        return named

    def update_from_tensors(self, serialized: str, timings: dict | None = None) -> str:
        """Read one payload of (name, tensor) pairs, check every name and shape, then copy.

        timings (optional) gets deserialize_s (reading the payload: mapping shared memory or
        opening IPC handles) and load_s (checks and the copy into the model)."""
        from areal.utils.tensor_ipc import TensorPayloadError, deserialize_named_tensors

        t0 = time.perf_counter()
        try:
            named = deserialize_named_tensors(serialized)
        except TensorPayloadError as exc:
            raise ValueError(f"serialized_named_tensors[0]: {exc}") from None
        t1 = time.perf_counter()
        count = len(named)
        try:
            params = self.parameters()
            _check_known_names(named, params)
            _copy_all(params, named)
        finally:
            named.clear()  # the sender's memory: let go of it now, even if a traceback is kept
        self.lora.reset()
        if timings is not None:
            timings.update(deserialize_s=t1 - t0, load_s=time.perf_counter() - t1)
        return f"Succeeded to update {count} parameter(s) from tensors."

    def load_from_disk(self, model_path: str, timings: dict | None = None) -> str:
        """Load a checkpoint folder into the running model; raises ValueError if incompatible.

        timings (optional) gets load_s: seconds to read the folder and copy it into the model."""
        from transformers import AutoModelForCausalLM

        t0 = time.perf_counter()
        try:
            new = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.runner.dtype)
        except Exception as exc:
            from areal.models.resolve import model_load_error

            raise ValueError("Failed to load model: " + model_load_error("model_path", model_path, exc)) from exc
        params = self.parameters()
        state = new.state_dict()
        weights = dict(self.runner.model.named_parameters(remove_duplicate=False))
        missing = sorted(set(weights) - set(state))
        if missing and not all(_is_tied_alias(m, params, state) for m in missing):
            raise ValueError(
                f"Checkpoint {model_path!r} lacks parameters {missing[:5]}; "
                "it does not match the served model's architecture."
            )
        unknown = sorted(set(state) - set(params))
        if unknown:
            raise ValueError(f"Checkpoint {model_path!r} has unknown parameters {unknown[:5]}.")
        _copy_all(params, list(state.items()))
        self.lora.reset()
        if timings is not None:
            timings["load_s"] = time.perf_counter() - t0
        return f"Succeeded to update model weights from {model_path}."

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> str:
        if group_name in self.groups:
            raise ValueError(
                f"Weight update group {group_name!r} already exists; destroy it first (/destroy_weights_update_group)."
            )
        rank = rank_offset  # one rank per server (tp 1)
        self.groups[group_name] = init_custom_process_group(
            backend=backend,
            master_address=master_address,
            master_port=master_port,
            world_size=world_size,
            rank=rank,
            group_name=group_name,
        )
        return f"Succeeded to initialize custom process group {group_name!r} (rank {rank})."

    def update_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        timings: dict | None = None,
    ) -> str:
        """Receive every broadcast first (keeps the collective in step), then check and copy.

        timings (optional) gets recv_s (until every tensor arrived) and load_s (the copy into
        the model)."""
        import torch
        import torch.distributed as dist

        group = self.groups.get(group_name)
        if group is None:
            raise ValueError(f"No weight update group {group_name!r}; call /init_weights_update_group first.")
        t0 = time.perf_counter()
        received = []
        for name, dtype, shape in zip(names, dtypes, shapes):
            tensor = torch.empty(shape, dtype=torch_dtype(dtype), device=self.runner.device)
            dist.broadcast(tensor, src=0, group=group)
            received.append((name, tensor))
        _sync(self.runner.device)
        t1 = time.perf_counter()
        params = self.parameters()
        _check_known_names(received, params)
        _copy_all(params, received)
        self.lora.reset()
        if timings is not None:
            timings.update(recv_s=t1 - t0, load_s=time.perf_counter() - t1)
        return f"Succeeded to update {len(received)} parameter(s) from distributed."

    def destroy_group(self, group_name: str) -> str:
        import torch.distributed as dist

        group = self.groups.pop(group_name, None)
        if group is None:
            raise ValueError(f"No weight update group {group_name!r} to destroy.")
        dist.destroy_process_group(group)
        return f"Succeeded to destroy custom process group {group_name!r}."


def _check_known_names(pairs: list, params: dict) -> None:
    """Refuse an update naming a parameter the served model does not have (before any copy)."""
    unknown = [name for name, _ in pairs if name not in params]
    if unknown:
        raise ValueError(
            f"Unknown parameter name(s) {unknown[:5]}; names must be the served model's Hugging Face state-dict names."
        )


def _is_tied_alias(name: str, params: dict, state: dict) -> bool:
    """A parameter absent from the checkpoint is fine if it shares storage with one present."""
    ptr = params[name].data_ptr()
    return any(params[other].data_ptr() == ptr for other in state if other in params)


def _sync(device) -> None:
    """Wait for the device's queued work (so timings and "done" replies are true on GPU)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _copy_all(params: dict, pairs: list) -> None:
    """Check every shape first so a bad update leaves the model untouched, then copy (and wait
    for the copies, so the update is complete when the reply is sent)."""
    import torch

    for name, source in pairs:
        target = params[name]
        if tuple(target.shape) != tuple(source.shape):
            raise ValueError(
                f"Parameter {name!r}: shape {list(source.shape)} does not match the model's {list(target.shape)}."
            )
    with torch.no_grad():
        for name, source in pairs:
            target = params[name]
            target.copy_(source.to(device=target.device, dtype=target.dtype))
    devices = {t.device for t in params.values()}
    for device in devices:
        _sync(device)
