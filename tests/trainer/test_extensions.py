"""The customization guide's worked example (examples/custom_task.py) runs for real: the driver
loads the custom dataset, runs the custom workflow against a built-in server and scores with the
custom reward, all named by import path in the config."""

import json
import subprocess
import sys

import pytest
import yaml

from areal.config import validate_config
from launcher.compose import compose


@pytest.mark.slow
def test_custom_dataset_workflow_and_reward_by_import_path(tmp_path, tiny_model_dir):
    from tests.serving import start_server

    server = start_server(tiny_model_dir, extra_args=["--dtype", "float32"])
    try:
        cfg = validate_config(
            compose(
                "tiny_arith_cpu",
                [
                    f"actor.path={tiny_model_dir}",
                    f"cluster.fileroot={tmp_path}",
                    "launcher.trainer_n_nodes=0",
                    f"rollout.server_addrs=[{server.url.removeprefix('http://')}]",
                    "launcher.inference_only_batches=1",
                    "train_dataset.type=examples.custom_task:load_doubling",
                    "train_dataset.kwargs={size: 8}",
                    "train_dataset.kwargs.uniform_answers=null",  # the demo's kwarg, merged in: left out
                    "train_dataset.batch_size=4",
                    "workflow.type=examples.custom_task:AnswerTwiceWorkflow",
                    "workflow.reward_fn=examples.custom_task:doubling_reward",
                ],
            )
        )
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump()))
        r = subprocess.run(
            [sys.executable, "-m", "areal.trainer.driver", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        report = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
        assert report["samples"] == 4 * cfg.gconfig.n_samples
        import torch

        batch = torch.load(f"{cfg.run_dir}/rollouts/batch_00000.pt", weights_only=True)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        prompt = tok.decode(batch["input_ids"][0][batch["loss_mask"][0] == 0], skip_special_tokens=True)
        n = prompt[0]
        assert prompt.startswith(f"{n}+{n}={n}+{n}=")  # the custom workflow doubled the question
        assert set(batch["rewards"].tolist()) <= {0.0, 1.0}  # the custom reward's values
    finally:
        server.stop()
