"""An abort-mode pause drains the episode workers' open /generate requests as it drains the
trainer's own (ServerControl.drain, RequestsOpenElsewhere): each worker's client counts them in a
counter the trainer reads, so the pause waits for their aborted answers before /pause_generation,
whose SGLang form otherwise finds a request handler holding the model-update lock and sleeps a
second. Against a real built-in server and a real worker process."""

import functools

from areal.engine.sglang.client import RemoteSGLangEngine
from areal.models.tiny import make_tiny_model_dir
from areal.workflow.in_workers import WorkflowInWorkers
from tests.rollout.long_episode import LONG, LongGeneration
from tests.serving import server_load, start_server, wait_for


def test_an_abort_pause_drains_a_workers_request_before_it_pauses_the_servers(tmp_path):
    model = make_tiny_model_dir(tmp_path / "long", max_position=LONG + 64)
    server = start_server(str(model), env={"OMP_NUM_THREADS": "1"})
    engine = RemoteSGLangEngine.from_pretrained(str(model), server_addrs=[server.url], rollout={"pause_mode": "abort"})
    workflow = WorkflowInWorkers(functools.partial(LongGeneration), 1)
    try:
        engine.submit({"i": 0}, workflow)
        wait_for(
            lambda: workflow.pool is not None and workflow.pool.open_requests.count == 1, "the worker's request open"
        )
        wait_for(lambda: server_load(server.url)["running"] == 1, "the worker's request running")
        assert engine.open_requests.count == 0  # the trainer's own client has none: only the worker's is drained

        report = engine.control.pause()

        assert report["requests_drained"] == 1 and workflow.pool.open_requests.count == 0
        # nothing left for /pause_generation, so it was asked for retract, which held nothing
        assert report["pause_sent_as_retract"] == 1.0 and report["requests_held"] == 0
        assert server_load(server.url)["running"] == 0
        engine.control.resume()
    finally:
        workflow.close()
        engine.destroy()
        server.stop()
    assert workflow.pool is None
