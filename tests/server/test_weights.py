"""Weight updates: from disk, and broadcast over gloo from this test process acting as the
trainer's rank 0 (world size 2: trainer + server)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.server.helpers import hf_greedy, prompt_ids

PROMPT = prompt_ids(5, 6)
N_NEW = 16


@pytest.fixture(scope="module")
def other_model_dir(allowed_dir):
    from tests.serving import make_varied_model_dir

    return str(make_varied_model_dir(allowed_dir / "model", seed=1))


@pytest.fixture(scope="module")
def other_model(other_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(other_model_dir, dtype="float32").eval()


def post(server, path, body):
    return requests.post(server.url + path, json=body, timeout=120)


def greedy(server):
    r = post(server, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": N_NEW, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()


def version(server):
    return requests.get(server.url + "/model_info").json()["weight_version"]


def test_update_from_disk_changes_outputs_and_version(
    server, ref_model, other_model, other_model_dir, varied_model_dir
):
    before = greedy(server)
    assert before["output_ids"] == hf_greedy(ref_model, PROMPT, N_NEW)
    r = post(
        server,
        "/update_weights_from_disk",
        {"model_path": other_model_dir, "weight_version": "v1", "load_format": None},
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    after = greedy(server)
    assert after["output_ids"] == hf_greedy(other_model, PROMPT, N_NEW) != before["output_ids"]
    assert after["meta_info"]["weight_version"] == "v1" == version(server)
    # without weight_version the version stays; a bad path fails with success false
    assert post(server, "/update_weights_from_disk", {"model_path": varied_model_dir}).json()["success"]
    assert version(server) == "v1" and greedy(server)["output_ids"] == before["output_ids"]
    r = post(server, "/update_weights_from_disk", {"model_path": other_model_dir + "/no/such"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert greedy(server)["output_ids"] == before["output_ids"]


def test_disk_loads_outside_the_weight_dirs_are_refused(server, allowed_dir, other_model_dir, tmp_path):
    """--weight-dirs limits disk loads, checked on the resolved path: '..' and a symlink inside
    an allowed folder that points outside are refused too; the message names the path and the
    option."""
    import shutil

    outside = tmp_path / "outside"
    shutil.copytree(other_model_dir, outside)
    link = allowed_dir / "link"
    link.symlink_to(outside, target_is_directory=True)
    before = version(server)
    for path in (str(outside), f"{allowed_dir}/../{outside.parent.name}/outside", str(link), "/no/such/dir"):
        r = post(server, "/update_weights_from_disk", {"model_path": path, "weight_version": "x"})
        assert r.status_code == 403 and r.json()["success"] is False, r.text
        message = r.json()["message"]
        assert path in message and "--weight-dirs" in message and "sglang.weight_dirs" in message
    assert version(server) == before


def test_update_weight_version(server):
    r = post(server, "/update_weight_version", {"new_version": "manual-7"})
    assert r.json() == {"success": True, "new_version": "manual-7", "message": "Weight version updated to manual-7"}
    assert version(server) == "manual-7"


def _join_gloo_group(pool, server, group: str):
    """The server joins `group` as rank 1 (its request sent from `pool`), this test as rank 0;
    returns this side's process group."""
    from areal.infra.ports import free_port
    from areal.utils.dist_group import init_custom_process_group

    port = free_port()
    reply = pool.submit(
        post,
        server,
        "/init_weights_update_group",
        {
            "master_address": "127.0.0.1",
            "master_port": port,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": group,
            "backend": "gloo",
        },
    )
    pg = init_custom_process_group(
        backend="gloo", master_address="127.0.0.1", master_port=port, world_size=2, rank=0, group_name=group
    )
    assert reply.result().json()["success"], reply.result().text
    return pg


def test_distributed_update_over_gloo(server, ref_model, other_model):
    import torch
    import torch.distributed as dist

    group = "test_group"
    with ThreadPoolExecutor(1) as pool:
        pg = _join_gloo_group(pool, server, group)
        try:
            state = other_model.state_dict()
            reply = pool.submit(
                post,
                server,
                "/update_weights_from_distributed",
                {
                    "names": list(state),
                    "dtypes": ["float32"] * len(state),
                    "shapes": [list(t.shape) for t in state.values()],
                    "group_name": group,
                    "flush_cache": True,
                    "weight_version": "v2",
                },
            )
            for tensor in state.values():
                dist.broadcast(tensor.contiguous(), src=0, group=pg)
            assert reply.result().json()["success"], reply.result().text
            out = greedy(server)
            assert out["output_ids"] == hf_greedy(other_model, PROMPT, N_NEW)
            assert out["meta_info"]["weight_version"] == "v2"
            # an unknown name: all tensors are still received, then the update is refused
            reply = pool.submit(
                post,
                server,
                "/update_weights_from_distributed",
                {"names": ["no.such.weight"], "dtypes": ["float32"], "shapes": [[2]], "group_name": group},
            )
            dist.broadcast(torch.zeros(2), src=0, group=pg)
            assert reply.result().status_code == 400
            assert "no.such.weight" in reply.result().json()["message"]
            assert version(server) == "v2"
        finally:
            r = post(server, "/destroy_weights_update_group", {"group_name": group})
            dist.destroy_process_group(pg)
        assert r.json()["success"], r.text
    assert greedy(server)["output_ids"] == hf_greedy(other_model, PROMPT, N_NEW)


def test_damaged_folder_is_refused_and_the_model_kept(server, allowed_dir, other_model_dir):
    import shutil

    damaged = allowed_dir / "damaged"
    shutil.copytree(other_model_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    before = greedy(server)["output_ids"]
    r = post(server, "/update_weights_from_disk", {"model_path": str(damaged), "weight_version": "bad"})
    assert r.status_code == 400 and r.json()["success"] is False
    message = r.json()["message"]
    assert f"model_path={damaged}: the model cannot be loaded (SafetensorError" in message, message
    assert "complete Hugging Face folder" in message
    assert greedy(server)["output_ids"] == before and version(server) != "bad"
