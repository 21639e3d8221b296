"""/update_weights_from_tensor between two real processes: this test process plays the trainer,
shares CPU tensors with a server it did not fork (shared memory by file name), and the server then
serves exactly those weights. Hostile or malformed payloads are a 400 and change nothing."""

import base64
import os
import pickle

import pytest
import requests

from tests.server.helpers import prompt_ids

torch = pytest.importorskip("torch")

from areal.utils.tensor_ipc import serialize_named_tensors  # noqa: E402 (after importorskip, as it imports torch)

PROMPT = prompt_ids(11, 6)
N_NEW = 12
ROUTE = "/update_weights_from_tensor"


@pytest.fixture(scope="module")
def server(varied_model_dir):
    from tests.serving import start_server

    handle = start_server(varied_model_dir, extra_args=["--dtype", "float32"])
    yield handle
    assert handle.stop() == 0, handle.log()


@pytest.fixture(scope="module")
def perturbed(varied_model_dir):
    """The served model with every weight moved by seeded noise: what the trainer sends."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype="float32").eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * param.std() * torch.randn(param.shape, generator=gen))
    return model


def post(server, path, body):
    return requests.post(server.url + path, json=body, timeout=120)


def generate(server):
    r = post(
        server,
        "/generate",
        {
            "input_ids": PROMPT,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": N_NEW, "temperature": 0, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def logprobs(out):
    return torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]], dtype=torch.float64)


def reference(model, output_ids):
    """The model's own greedy picks and their logprobs for `output_ids` after PROMPT (one
    transformers forward over the whole sequence)."""
    ids = torch.tensor([PROMPT + output_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1].double()
    lp = torch.log_softmax(logits, -1)
    return lp.argmax(-1).tolist(), lp.gather(1, torch.tensor(output_ids)[:, None])[:, 0]


def state_items(model):
    """(name, tensor) pairs as a trainer has them: every state-dict entry, tied ones included."""
    return list(model.state_dict().items())


def send(server, pairs, **body):
    payload = serialize_named_tensors(pairs)
    return post(server, ROUTE, {"serialized_named_tensors": [payload], **body})


def restore(server, varied_model_dir):
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype="float32")
    r = send(server, state_items(original), weight_version="default")
    assert r.status_code == 200 and r.json()["success"], r.text


def test_served_outputs_are_the_sent_weights(server, perturbed, ref_model, varied_model_dir):
    before = generate(server)
    pairs = state_items(perturbed)
    half = len(pairs) // 2
    try:
        # two buckets, as a trainer sends a large model; the version comes with the last
        r = send(server, pairs[:half], flush_cache=False, load_format=None)
        assert r.status_code == 200 and r.json()["success"], r.text
        last = {
            "serialized_named_tensors": [serialize_named_tensors(pairs[half:])],
            "weight_version": "t1",
            "load_format": "direct",
            "abort_all_requests": False,
            "torch_empty_cache": True,
            "selector": "all",
            "rid": "u1",
        }
        for _ in range(2):  # the same text twice, as a retry sends it: both read the tensors
            r = post(server, ROUTE, last)
            reply = r.json()
            assert r.status_code == 200 and reply["success"], r.text
        assert reply["message"].endswith("Weight version updated to t1.")
        assert reply["load_s"] >= 0 and reply["deserialize_s"] >= 0
        out = generate(server)
        assert out["meta_info"]["weight_version"] == "t1"
        greedy, expected = reference(perturbed, out["output_ids"])
        assert out["output_ids"] == greedy != before["output_ids"]
        torch.testing.assert_close(logprobs(out), expected, atol=1e-5, rtol=0)
        # the original model's reference is far away: the comparison can tell the two apart
        _, original = reference(ref_model, out["output_ids"])
        assert (original - expected).abs().max() > 0.1
    finally:
        restore(server, varied_model_dir)
    assert generate(server)["output_ids"] == before["output_ids"]


class Reduce:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_hostile_payload_is_refused_and_changes_nothing(server, tmp_path):
    before = generate(server)
    version = before["meta_info"]["weight_version"]
    marker = tmp_path / "pwned"
    evil = base64.b64encode(pickle.dumps(Reduce(os.system, f"touch {marker}"))).decode()
    r = post(server, ROUTE, {"serialized_named_tensors": [evil], "weight_version": "evil"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "refused global 'posix.system'" in r.json()["message"]
    assert not marker.exists()
    after = generate(server)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["weight_version"] == version
    torch.testing.assert_close(logprobs(after), logprobs(before), atol=0, rtol=0)


def test_bad_names_or_shapes_load_nothing(server, perturbed):
    """Every name and shape is checked before anything is copied: a bucket with one bad entry
    leaves even its good entries unloaded."""
    before = generate(server)
    good = ("model.norm.weight", perturbed.model.norm.weight.detach())
    for bad, needle in (
        (("no.such.weight", torch.zeros(2)), "no.such.weight"),
        (("lm_head.weight", torch.zeros(3, 3)), "shape [3, 3]"),
    ):
        r = send(server, [good, bad], weight_version="bad")
        assert r.status_code == 400 and r.json()["success"] is False, r.text
        assert needle in r.json()["message"]
    after = generate(server)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["weight_version"] == before["meta_info"]["weight_version"]
    torch.testing.assert_close(logprobs(after), logprobs(before), atol=0, rtol=0)


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"serialized_named_tensors": ["x"], "names": []}, "unknown key(s) ['names']"),
        ({}, "'serialized_named_tensors' (a list of base64 strings"),
        ({"serialized_named_tensors": "abc"}, "'serialized_named_tensors' (a list of base64 strings"),
        ({"serialized_named_tensors": ["a", "b"]}, "has 2 entries; this server runs one"),
        ({"serialized_named_tensors": []}, "has 0 entries"),
        (
            {"serialized_named_tensors": ["x"], "load_format": "flattened_bucket"},
            "load_format 'flattened_bucket' is not supported",
        ),
        ({"serialized_named_tensors": ["x"], "selector": "draft"}, "no draft model"),
        ({"serialized_named_tensors": ["x"], "flush_cache": "yes"}, "'flush_cache' must be bool"),
    ],
)
def test_malformed_requests_are_400_naming_the_key(server, body, needle):
    r = post(server, ROUTE, body)
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]


def test_unreadable_payload_is_400(server):
    r = post(server, ROUTE, {"serialized_named_tensors": ["not base64 !"]})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "serialized_named_tensors[0]" in r.json()["message"]
    assert "not valid base64" in r.json()["message"]
