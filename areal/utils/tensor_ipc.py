"""Named tensors between a trainer and an inference server as text, for /update_weights_from_tensor.

The format is SGLang's (`MultiprocessingSerializer` in its HTTP form): a list of (name, tensor)
pairs pickled with torch's multiprocessing reductions, base64-encoded. The pickle holds where the
data lives, not the data:

* CUDA tensors travel as CUDA IPC handles (torch's `reduce_tensor`). The device is named by its
  UUID instead of its index, as SGLang's patched reductions do, so the two processes may see the
  GPU under different indices (CUDA_VISIBLE_DEVICES); SGLang's server reads that form too.
* CPU tensors travel through POSIX shared memory, by file name (torch's `file_system` scheme).
  Torch's default for CPU tensors (`file_descriptor`) passes a descriptor through
  `multiprocessing.resource_sharer`, whose handshake needs the sender's multiprocessing authkey,
  which only the sender's own children inherit: a server started separately cannot connect. A
  file name needs no handshake. The global sharing strategy is left alone (it also governs the
  sender's DataLoader workers); this module uses the scheme for its own pickles only.

What the sender must know:

* Keep the tensors alive (and unmodified) until the server has answered the request that carried
  the payload: the payload points into them. CUDA: an IPC handle of their memory. CPU: the name
  of the shared-memory segment that holds them.
* CPU tensors are moved into shared memory in place, once, as torch.multiprocessing does: the
  caller's tensors keep their values and identity, but their data now live in /dev/shm (which
  must have room for them; send large updates in buckets), and later sends of the same tensors
  cost no copy. Each process mapping a segment holds a reference on it, and the segment's name
  goes away with the last one, so a payload never read leaves nothing behind. While the sender
  holds the tensors a payload can be read any number of times (several servers, retries); after
  it has dropped them, reading fails with a clear error. (Torch's own reduction instead adds a
  reference for the reader, which the reader's rebuild drops: one read per payload, and a
  payload never read keeps its segment until the sender exits. This module's sender adds none
  and its reader drops none; a receiver killed while it maps a segment leaves that segment to
  the sender's torch_shm_manager, which removes it when the sender exits.)

The receiving side (`deserialize_named_tensors`) never runs a general unpickler: an allow-list
admits only torch's tensor and storage rebuild functions, wrapped so that their arguments are
checked first, plus `torch.Size` and dtypes. Classes a rebuild function needs as an argument
(torch.Tensor, storages) arrive as inert tokens, so a pickle cannot call them (e.g. to allocate a
terabyte). Any other global raises `UnsafePayload` naming the refused `module.global` when the
unpickler meets it, so it is never called, nor anything the pickle holds after it.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import pickle
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SHM_DIR = "/dev/shm"
_SHM_HANDLE = re.compile(rb"/torch_\d+_\d+_\d+")
_REDUCTIONS = "torch.multiprocessing.reductions"


class TensorPayloadError(ValueError):
    """The payload is not a readable list of (name, tensor) pairs; nothing was loaded."""


class UnsafePayload(TensorPayloadError):
    """The payload names a global outside the allow-list (it would run arbitrary code)."""

    def __init__(self, refused: str):
        self.refused = refused
        super().__init__(
            f"refused global {refused!r} in the serialized tensors: only torch's tensor and "
            "storage rebuild functions, torch.Size and dtypes may appear. Serialize the (name, "
            "tensor) list with areal.utils.tensor_ipc.serialize_named_tensors (CPU tensors by "
            "shared-memory file name, CUDA tensors by IPC handle)."
        )


# ---- sending ----------------------------------------------------------------------------------
def serialize_named_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    """Base64 text of `named` for one entry of `serialized_named_tensors` (see the module
    docstring for how long the sender must keep what alive)."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing  # registers torch's reductions with ForkingPickler

    pairs = _checked_pairs(named, "serialize_named_tensors")
    buf = io.BytesIO()
    pickler = ForkingPickler(buf, pickle.HIGHEST_PROTOCOL)
    table = dict(pickler.dispatch_table)
    for cls, reducer in table.items():
        if _is_tensor_reducer(reducer):
            table[cls] = _reduce_tensor
    table[torch.UntypedStorage] = _reduce_cpu_storage
    pickler.dispatch_table = table
    pickler.dump([(name, _shareable(name, tensor)) for name, tensor in pairs])
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _is_tensor_reducer(reducer) -> bool:
    from torch.multiprocessing import reductions

    return reducer is reductions.reduce_tensor


def _shareable(name: str, tensor):
    """What gets pickled: the tensor without autograd state (the same memory)."""
    import torch

    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise ValueError(
            f"serialize_named_tensors: tensor {name!r} is a {type(tensor).__name__}, "
            "which the server does not rebuild; send a plain tensor (for a DTensor, "
            "its full_tensor() or local shard)."
        )
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"serialize_named_tensors: tensor {name!r} is on {tensor.device}; only "
            "CPU and CUDA tensors can be shared. Move it to one of those first."
        )
    return tensor.detach()


def _reduce_cpu_storage(storage):
    """Pickle a CPU storage by its shared-memory file name, moving it into shared memory first
    (in place, once). Unlike torch's own reduction this takes no extra reference for the reader:
    the segment lives exactly as long as the sender's tensors or a reader's copy of them."""
    from torch.multiprocessing import reductions

    if storage.device.type != "cpu":
        raise ValueError(f"a {storage.device} storage cannot be pickled alone; send the tensor.")
    if storage.nbytes() == 0:  # an empty storage has no segment
        return reductions.rebuild_storage_empty, (type(storage),)
    manager, handle, size = storage._share_filename_cpu_()
    return reductions.rebuild_storage_filename, (type(storage), manager, handle, size)


def _reduce_tensor(tensor):
    """torch's reduction, with a CUDA tensor's device given by UUID (as SGLang sends it)."""
    from torch.multiprocessing import reductions

    rebuild, args = reductions.reduce_tensor(tensor)
    if tensor.is_cuda and len(args) == _CUDA_ARGS and isinstance(args[_CUDA_DEVICE], int):
        args = args[:_CUDA_DEVICE] + (_device_uuid(args[_CUDA_DEVICE]),) + args[_CUDA_DEVICE + 1 :]
    return rebuild, args


def _device_uuid(index: int) -> str:
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


# ---- receiving --------------------------------------------------------------------------------
def deserialize_named_tensors(data: str | bytes) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of one payload (base64 text, or raw pickle bytes); raises
    UnsafePayload for a refused global and TensorPayloadError for anything else unreadable."""
    raw = _decode(data)
    try:
        obj = _AllowListUnpickler(io.BytesIO(raw)).load()
    except TensorPayloadError:
        raise
    except Exception as exc:  # truncated pickle, a token called, a failed rebuild, ...
        raise TensorPayloadError(
            f"the serialized tensors cannot be read: {type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    # detach(): a fresh tensor on the same memory, without whatever state the pickle set
    return [(name, t.detach()) for name, t in _checked_pairs(obj, "the serialized tensors")]


def _decode(data) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        if data[:1] == b"\x80":  # a pickle's PROTO opcode: raw bytes, not base64
            return data
    elif not isinstance(data, str):
        raise TensorPayloadError(f"the serialized tensors must be base64 text, got {type(data).__name__}.")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TensorPayloadError(
            f"the serialized tensors are not valid base64 ({exc}); send the text serialize_named_tensors returned."
        ) from None


def _checked_pairs(obj, what: str) -> list:
    import torch

    if not isinstance(obj, (list, tuple)):
        raise TensorPayloadError(f"{what} must be a list of (name, tensor) pairs, got {type(obj).__name__}.")
    for i, item in enumerate(obj):
        if not (
            isinstance(item, (tuple, list))
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], torch.Tensor)
        ):
            raise TensorPayloadError(
                f"{what}: item {i} is {_describe(item)}, not a (name, tensor) pair with a string name."
            )
    return [(name, tensor) for name, tensor in obj]


def _describe(item) -> str:
    if isinstance(item, (tuple, list)):
        return f"a {type(item).__name__} of ({', '.join(type(v).__name__ for v in item[:3])})"
    return f"a {type(item).__name__}"


class _Token:
    """Stands for a class that a rebuild function takes as an argument; not callable."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_TENSOR, _PARAMETER = _Token("torch.Tensor"), _Token("torch.nn.Parameter")
_UNTYPED, _TYPED = _Token("torch.UntypedStorage"), _Token("torch.TypedStorage")
_CUDA_ARGS, _CUDA_DEVICE = 15, 6  # rebuild_cuda_tensor's arity and its storage_device argument


def _real_class(token):
    import torch

    return {
        _TENSOR: torch.Tensor,
        _PARAMETER: torch.nn.Parameter,
        _UNTYPED: torch.UntypedStorage,
        _TYPED: torch.storage.TypedStorage,
    }[token]


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise TensorPayloadError(f"the serialized tensors hold a malformed {what}.")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_int_tuple(v) -> bool:
    return isinstance(v, tuple) and all(_is_int(d) and d >= 0 for d in v)


def _rebuild_typed_storage(storage, dtype):
    import torch
    from torch.multiprocessing import reductions

    _expect(isinstance(storage, torch.UntypedStorage) and isinstance(dtype, torch.dtype), "typed storage")
    return reductions.rebuild_typed_storage(storage, dtype)


def _rebuild_storage_empty(cls):
    import torch

    _expect(cls is _UNTYPED, "empty storage")
    return torch.UntypedStorage()


def _rebuild_storage_filename(cls, manager, handle, size, dtype=None):
    """Map a shared-memory segment, once its name and size are checked (mapping more than the
    segment holds would grow it, or fault on reading). The mapping holds its own reference on
    the segment until the tensors are dropped. Torch's rebuild also drops one reference at once,
    the one torch's sender adds for its reader; ours adds none (see the module docstring), and
    dropping it would unlink the segment while the sender still holds its tensors."""
    import torch

    _expect(
        cls is _UNTYPED
        and isinstance(manager, bytes)
        and isinstance(handle, bytes)
        and _is_int(size)
        and size >= 0
        and (dtype is None or isinstance(dtype, torch.dtype)),
        "shared-memory storage",
    )
    _expect(
        os.path.basename(manager) == b"manager.sock"
        and os.path.basename(os.path.dirname(manager)).startswith(b"torch-shm-dir")
        and _SHM_HANDLE.fullmatch(handle) is not None,
        "shared-memory name",
    )
    nbytes = size * (1 if dtype is None else torch._utils._element_size(dtype))
    try:
        have = os.stat(os.path.join(SHM_DIR.encode(), handle.lstrip(b"/"))).st_size
    except OSError:
        raise TensorPayloadError(
            f"shared-memory segment {handle.decode()} does not exist: the sender dropped its "
            "tensors (or exited) before this payload was read. Keep the tensors alive until "
            "the server has answered, then serialize them again to resend."
        ) from None
    _expect(have >= nbytes, "shared-memory size")
    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, handle, nbytes)
    if dtype is None:
        return storage
    return torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)


def _rebuild_cpu_tensor(cls, storage, metadata):
    import torch
    from torch.multiprocessing import reductions

    _expect(
        cls in (_TENSOR, _PARAMETER)
        and isinstance(storage, torch.storage.TypedStorage)
        and isinstance(metadata, tuple)
        and len(metadata) == 4,
        "CPU tensor",
    )
    offset, size, stride, requires_grad = metadata
    _expect(
        _is_int(offset)
        and offset >= 0
        and isinstance(size, tuple)
        and _is_int_tuple(size)
        and _is_int_tuple(stride)
        and isinstance(requires_grad, bool),
        "CPU tensor layout",
    )
    return reductions.rebuild_tensor(_real_class(cls), storage, metadata)


def _rebuild_cuda_tensor(*args):
    """torch's rebuild_cuda_tensor (opens the IPC handle), after checking every argument; the
    device may be an index or a UUID (SGLang's form, which our sender uses too)."""
    import torch
    from torch.multiprocessing import reductions

    _expect(len(args) == _CUDA_ARGS, "CUDA tensor")
    (
        tensor_cls,
        size,
        stride,
        offset,
        storage_cls,
        dtype,
        device,
        handle,
        storage_bytes,
        storage_offset,
        requires_grad,
        ref_handle,
        ref_offset,
        event_handle,
        event_sync,
    ) = args
    _expect(
        tensor_cls in (_TENSOR, _PARAMETER)
        and storage_cls in (_TYPED, _UNTYPED)
        and isinstance(size, tuple)
        and _is_int_tuple(size)
        and _is_int_tuple(stride)
        and _is_int(offset)
        and isinstance(dtype, torch.dtype)
        and (handle is None or isinstance(handle, bytes))
        and _is_int(storage_bytes)
        and _is_int(storage_offset)
        and isinstance(requires_grad, bool)
        and (ref_handle is None or isinstance(ref_handle, bytes))
        and _is_int(ref_offset)
        and (event_handle is None or isinstance(event_handle, bytes))
        and isinstance(event_sync, bool),
        "CUDA tensor",
    )
    # the checked arguments as unpacked above, but for this process's device index and the real classes
    rebuilt = list(args)
    rebuilt[_CUDA_DEVICE] = _local_device(device)
    rebuilt[0], rebuilt[4] = _real_class(tensor_cls), _real_class(storage_cls)
    return reductions.rebuild_cuda_tensor(*rebuilt)


def _local_device(device) -> int:
    """This process's index of the GPU the sender named by index or UUID."""
    import torch

    if not torch.cuda.is_available():
        raise TensorPayloadError(
            "the serialized tensors are CUDA tensors, but this process has "
            "no CUDA device; run the server on the sender's GPU."
        )
    if _is_int(device) and 0 <= device < torch.cuda.device_count():
        return device
    if isinstance(device, str):
        for index in range(torch.cuda.device_count()):
            if str(torch.cuda.get_device_properties(index).uuid) == device:
                return index
        raise TensorPayloadError(
            f"the serialized tensors live on GPU {device}, which this "
            "process does not see; run the server on the sender's GPU "
            "(check CUDA_VISIBLE_DEVICES)."
        )
    raise TensorPayloadError(f"the serialized tensors name an invalid device {device!r}.")


def _allowed_globals() -> dict:
    import torch

    allowed = {
        (_REDUCTIONS, "rebuild_tensor"): _rebuild_cpu_tensor,
        (_REDUCTIONS, "rebuild_typed_storage"): _rebuild_typed_storage,
        (_REDUCTIONS, "rebuild_storage_filename"): _rebuild_storage_filename,
        (_REDUCTIONS, "rebuild_storage_empty"): _rebuild_storage_empty,
        (_REDUCTIONS, "rebuild_cuda_tensor"): _rebuild_cuda_tensor,
        # what a sender with SGLang's patched reductions names (the same arguments)
        ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"): _rebuild_cuda_tensor,
        ("torch", "Size"): torch.Size,
        ("torch", "Tensor"): _TENSOR,
        ("torch.nn.parameter", "Parameter"): _PARAMETER,
        ("torch", "UntypedStorage"): _UNTYPED,
        ("torch.storage", "UntypedStorage"): _UNTYPED,
        ("torch", "TypedStorage"): _TYPED,
        ("torch.storage", "TypedStorage"): _TYPED,
    }
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


class _AllowListUnpickler(pickle.Unpickler):
    """Resolves only the globals of `_allowed_globals`; every other lookup is refused."""

    _allowed: dict | None = None

    def find_class(self, module: str, name: str):
        if _AllowListUnpickler._allowed is None:
            _AllowListUnpickler._allowed = _allowed_globals()
        found = self._allowed.get((module, name))
        if found is None:
            raise UnsafePayload(f"{module}.{name}")
        return found

    def persistent_load(self, pid):
        raise UnsafePayload(f"persistent id {str(pid)[:50]!r}")
