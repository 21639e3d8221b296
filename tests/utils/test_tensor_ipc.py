"""areal.utils.tensor_ipc: (name, tensor) lists as text, CPU tensors through shared memory by file
name (so a process the sender did not start can read them), and an allow-list unpickler that
refuses every other global before it can be called."""

import base64
import io
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from areal.utils.tensor_ipc import (  # noqa: E402 (after importorskip, as it imports torch)
    TensorPayloadError,
    UnsafePayload,
    deserialize_named_tensors,
    serialize_named_tensors,
)

# Reads a payload from stdin in a process unrelated to the sender (not a multiprocessing child:
# it has its own authkey), prints what it got, and drops the tensors, as a server does once it
# has copied them.
RECEIVER = """
import gc, json, sys
from areal.utils.tensor_ipc import deserialize_named_tensors
pairs = deserialize_named_tensors(sys.stdin.read())
print(json.dumps([[n, str(t.dtype), list(t.shape), t.double().flatten().tolist()]
                  for n, t in pairs]))
del pairs
gc.collect()
"""


def sample_tensors():
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=gen)
    return [
        ("w.float32", base),
        ("w.transposed", base.t()),  # not contiguous: sent as a contiguous copy
        ("w.bfloat16", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),
        ("w.int64", torch.arange(7)),
        ("w.scalar", torch.tensor(2.5)),
        ("w.empty", torch.empty(0, 3)),
        ("w.param", torch.nn.Parameter(torch.randn(2, 2, generator=gen))),
    ]


def shm_names(payload: str) -> list[str]:
    """The shared-memory segments a payload names (read from its pickle, not by running it)."""
    names = []
    for op, arg, _ in pickletools.genops(base64.b64decode(payload)):
        if isinstance(arg, bytes) and re.fullmatch(rb"/torch_\d+_\d+_\d+", arg):
            names.append(arg.decode().lstrip("/"))
    return names


def assert_same(sent, got):
    assert [n for n, _ in got] == [n for n, _ in sent]
    for (_, a), (_, b) in zip(sent, got):
        assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(b, a.detach())


def test_round_trip_in_process():
    sent = sample_tensors()
    payload = serialize_named_tensors(sent)
    assert isinstance(payload, str)
    got = deserialize_named_tensors(payload)
    assert_same(sent, got)
    assert all(type(t) is torch.Tensor for _, t in got)


def receive_elsewhere(payload: str) -> list:
    proc = subprocess.run(
        [sys.executable, "-c", RECEIVER],
        input=payload,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_round_trip_across_unrelated_processes():
    """Receivers started separately (as servers are) get the values exactly, as often as they
    read while the sender holds its tensors, also after an earlier receiver dropped its copy;
    the sender's tensors keep their values; once it drops them their segments are gone, and a
    late read is a clear error."""
    sent = sample_tensors()
    expected = [[n, str(t.dtype), list(t.shape), t.detach().double().flatten().tolist()] for n, t in sent]
    payload = serialize_named_tensors(sent)
    segments = shm_names(payload)
    assert len(segments) == 5  # one per non-empty storage: "w.transposed" shares "w.float32"'s
    for _ in range(2):  # a second server, or a retry
        assert receive_elsewhere(payload) == expected
        assert all(os.path.exists(f"/dev/shm/{s}") for s in segments)
    assert receive_elsewhere(serialize_named_tensors(sent)) == expected  # the next update
    assert [[n, str(t.dtype), list(t.shape), t.detach().double().flatten().tolist()] for n, t in sent] == expected
    del sent
    assert not [s for s in segments if os.path.exists(f"/dev/shm/{s}")]
    with pytest.raises(TensorPayloadError, match="Keep the tensors alive"):
        deserialize_named_tensors(payload)


def test_an_unread_payload_leaves_nothing_behind():
    tensor = torch.ones(100)
    segments = shm_names(serialize_named_tensors([("w", tensor)]))
    assert len(segments) == 1 and os.path.exists(f"/dev/shm/{segments[0]}")
    del tensor
    assert not os.path.exists(f"/dev/shm/{segments[0]}")


def test_torchs_default_descriptor_pickle_is_refused():
    """torch's own CPU reduction passes a file descriptor through a handshake that needs the
    sender's authkey; such a payload is refused by name instead of hanging or failing later."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # registers torch's reductions with ForkingPickler

    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump([("w", torch.ones(3))])
    with pytest.raises(UnsafePayload, match="torch.multiprocessing.reductions.rebuild_storage_fd"):
        deserialize_named_tensors(base64.b64encode(buf.getvalue()).decode())


class Reduce:
    """Pickles as `fn(*args)`: what a hostile payload asks the unpickler to call."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def hostile_payloads(marker: str) -> dict:
    """Each would create `marker` if unpickled by a plain pickle.loads."""
    from torch.multiprocessing import reductions

    meta = (0, torch.Size([1]), (1,), False)
    return {
        "os.system": (Reduce(os.system, f"touch {marker}"), "posix.system"),
        "builtins.eval": (Reduce(eval, f"open({marker!r}, 'w')"), "builtins.eval"),
        "subprocess": (Reduce(subprocess.call, ["touch", marker]), "subprocess.call"),
        # a well-formed list whose tensor hides the gadget inside an allowed rebuild call
        "nested": (
            [("w", Reduce(reductions.rebuild_tensor, torch.Tensor, Reduce(os.system, f"touch {marker}"), meta))],
            "posix.system",
        ),
        "getattr chain": (Reduce(getattr, Reduce(__import__, "os"), "system"), "builtins.getattr"),
    }


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "subprocess", "nested", "getattr chain"])
def test_hostile_payloads_are_refused_before_anything_runs(kind, tmp_path):
    marker = str(tmp_path / "pwned")
    obj, refused = hostile_payloads(marker)[kind]
    data = pickle.dumps(obj)
    with pytest.raises(UnsafePayload) as info:
        deserialize_named_tensors(base64.b64encode(data).decode())
    assert info.value.refused == refused and refused in str(info.value)
    with pytest.raises(UnsafePayload):
        deserialize_named_tensors(data)  # raw pickle bytes: the same check
    assert not os.path.exists(marker)


def test_classes_passed_as_arguments_cannot_be_called():
    """torch.UntypedStorage may appear (as a rebuild argument), but calling it to allocate a
    terabyte is refused: classes arrive as inert tokens."""
    data = pickle.dumps(Reduce(torch.UntypedStorage, 2**40))
    with pytest.raises(TensorPayloadError, match="not callable"):
        deserialize_named_tensors(data)


def test_a_forged_segment_size_is_refused():
    """A payload naming more bytes than its segment holds would grow the segment (or fault on
    reading); it is refused, and the segment keeps its size."""
    from torch.multiprocessing import reductions

    shared = torch.UntypedStorage._new_using_filename_cpu(16)
    manager, handle, _ = shared._share_filename_cpu_()
    path = "/dev/shm" + handle.decode()
    before = os.stat(path).st_size
    forged = Reduce(reductions.rebuild_storage_filename, torch.UntypedStorage, manager, handle, 2**30)
    with pytest.raises(TensorPayloadError, match="malformed shared-memory size"):
        deserialize_named_tensors(pickle.dumps([("w", forged)]))
    assert os.stat(path).st_size == before


@pytest.mark.parametrize(
    "obj, needle",
    [
        ({"w": 1}, "must be a list of (name, tensor) pairs, got dict"),
        ([(1, "x")], "item 0 is a tuple of (int, str)"),
        ([("w",)], "item 0 is a tuple of (str)"),
        (["w"], "item 0 is a str"),
    ],
)
def test_payload_structure_is_checked(obj, needle):
    with pytest.raises(TensorPayloadError) as info:
        deserialize_named_tensors(pickle.dumps(obj))
    assert needle in str(info.value)


def test_unreadable_text_is_a_payload_error():
    with pytest.raises(TensorPayloadError, match="not valid base64"):
        deserialize_named_tensors("not base64 !")
    with pytest.raises(TensorPayloadError, match="cannot be read"):
        deserialize_named_tensors(base64.b64encode(b"\x80\x05garbage").decode())


def test_sender_checks_its_input():
    with pytest.raises(ValueError, match="item 0"):
        serialize_named_tensors([("w", [1, 2])])
    with pytest.raises(ValueError, match="'w' is on meta"):
        serialize_named_tensors([("w", torch.empty(2, device="meta"))])

    class Subclass(torch.Tensor):
        pass

    with pytest.raises(ValueError, match="'w' is a Subclass, which the server does not rebuild"):
        serialize_named_tensors([("w", torch.ones(2).as_subclass(Subclass))])
