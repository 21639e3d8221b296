"""The key sets client and server share (areal/infra/sglang_keys.py), and what the client sends
on each route is what the built-in server accepts there."""

import pytest

from areal.engine.sglang import protocol
from areal.infra import sglang_keys
from areal.server import routes_weights, validation


def test_client_and_server_read_the_same_sampling_keys_and_memory_tags():
    assert protocol.SAMPLING_KEYS is sglang_keys.SAMPLING_KEYS
    assert protocol.MEMORY_TAGS is sglang_keys.MEMORY_TAGS
    accepted = sglang_keys.SAMPLING_KEYS | set(validation.NEUTRAL_SAMPLING)
    validation.check_keys(dict.fromkeys(protocol.SAMPLING_KEYS), accepted, "sampling_params")


@pytest.mark.parametrize(
    "sent, accepted",
    [
        (protocol.DISK_UPDATE_KEYS, routes_weights.DISK_KEYS),
        (protocol.TENSOR_UPDATE_KEYS, routes_weights.TENSOR_KEYS),
        (protocol.DISTRIBUTED_UPDATE_KEYS, routes_weights.DISTRIBUTED_KEYS),
    ],
)
def test_weight_updates_the_client_sends_are_accepted(sent, accepted):
    assert sent <= accepted
