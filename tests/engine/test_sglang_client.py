"""RemoteSGLangEngine against real built-in servers (subprocesses, CPU, tiny models).

One module-scoped engine started with from_pretrained(dp_size=2): it launches and owns two
servers (with an API key, so every call here also checks the bearer header).
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from areal.api.inference import ModelRequest
from areal.api.weights import WeightUpdateMeta
from areal.engine.sglang.client import RemoteSGLangEngine
from areal.engine.sglang.http import ServerError
from areal.infra.ports import free_port
from tests.serving import make_varied_model_dir, pause_mid_generation, server_load, start_server, wait_for

KEY = "test-key"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return str(make_varied_model_dir(root / "a", seed=0)), str(make_varied_model_dir(root / "b", seed=1))


@pytest.fixture(scope="module")
def engine(models, tmp_path_factory):
    eng = RemoteSGLangEngine.from_pretrained(
        models[0],
        dp_size=2,
        # weight_dirs: model b lies outside the run's folders, where disk loads are limited to
        sglang={"api_key": KEY, "dtype": "float32", "weight_dirs": [str(Path(models[1]).parent)]},
        cluster={"fileroot": str(tmp_path_factory.mktemp("runs"))},
        launcher={"server_env": {"OMP_NUM_THREADS": "1"}},
        rollout={"request_timeout_s": 120, "setup_timeout_s": 180},
    )
    yield eng
    eng.destroy()


def served(engine):
    return {a: engine.control.server_info(a)["batching"]["requests_served"] for a in engine.addrs}


def run(engine, reqs):
    async def go():
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    return asyncio.run(go())


def greedy(n=2, tokens=12):
    return [ModelRequest(input_ids=[1, 5, 6, 7, 8], max_new_tokens=tokens, temperature=0.0) for _ in range(n)]


def test_generation_spreads_over_both_servers(engine):
    assert len(engine.addrs) == 2
    before = served(engine)
    resps = run(engine, [ModelRequest(input_ids=[1, 5, 6], max_new_tokens=8) for _ in range(8)])
    after = served(engine)
    assert {a: after[a] - before[a] for a in engine.addrs} == {a: 4 for a in engine.addrs}
    for r in resps:
        assert 1 <= r.output_len <= 8 and r.stop_reason in ("stop", "length")
        assert len(r.output_logprobs) == len(r.output_versions) == r.output_len
        assert all(lp <= 0 for lp in r.output_logprobs)
        assert r.output_versions == [0] * r.output_len
        assert r.input_tokens == [1, 5, 6] and r.latency > 0


def test_api_key_is_required_and_sent(engine):
    resp = requests.get(f"http://{engine.addrs[0]}/server_info", timeout=10)
    assert resp.status_code == 401
    assert engine.control.server_info(engine.addrs[0])["weight_version"] == "default"


def test_disk_weight_update_changes_outputs_and_versions_on_both(engine, models):
    before = run(engine, greedy())
    assert before[0].output_tokens == before[1].output_tokens  # same model on both servers
    engine.control.update_weights(WeightUpdateMeta("disk", path=models[1], version=1))
    assert engine.get_version() == 1
    assert {engine.control.server_info(a)["weight_version"] for a in engine.addrs} == {"1"}
    # the version check after recovery reads /model_info, where SGLang keeps it
    assert engine.control.server_versions() == {a: 1 for a in engine.addrs}
    after = run(engine, greedy())
    assert after[0].output_tokens == after[1].output_tokens != before[0].output_tokens
    assert all(r.output_versions == [1] * r.output_len for r in after)


def count_streams(monkeypatch) -> list:
    """The chunk lists the client parses as streams from now on (protocol.parse_generate_stream)."""
    from areal.engine.sglang import protocol

    seen, parse = [], protocol.parse_generate_stream
    monkeypatch.setattr(protocol, "parse_generate_stream", lambda chunks: seen.append(chunks) or parse(chunks))
    return seen


def test_streamed_answers_equal_whole_ones(engine, monkeypatch):
    """rollout.stream_interval: the same greedy answers, logprobs and versions, streamed."""
    whole = run(engine, greedy(tokens=10))
    monkeypatch.setattr(engine, "stream_interval", 3)
    streams = count_streams(monkeypatch)
    streamed = run(engine, greedy(tokens=10))
    assert [len(chunks) for chunks in streams] == [4, 4]  # tokens 3, 6, 9, then the answer
    for a, b in zip(whole, streamed):
        assert (a.output_tokens, a.output_versions, a.stop_reason) == (
            b.output_tokens,
            b.output_versions,
            b.stop_reason,
        )
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-6)


def test_the_client_resolves_rollout_stream_interval_for_its_servers(engine, models, monkeypatch):
    """A client that finds the servers resolves rollout.stream_interval with their program: auto
    gives whole answers from built-in servers even under in_place (they label every token); an
    interval set in the config streams the answers in chunks of that many tokens."""
    streams = count_streams(monkeypatch)
    for interval, resolved, chunks in (("auto", None, []), (3, 3, [4, 4])):
        client = RemoteSGLangEngine.from_pretrained(
            models[0],
            server_addrs=engine.addrs,
            sglang={"api_key": KEY},
            rollout={"pause_mode": "in_place", "stream_interval": interval, "setup_timeout_s": 60},
        )
        try:
            assert (client.server_kind, client.pause_mode, client.stream_interval) == ("builtin", "in_place", resolved)
            streams.clear()
            assert [r.output_len for r in run(client, greedy(tokens=10))] == [10, 10]
            assert [len(c) for c in streams] == chunks  # tokens 3, 6, 9, then the answer's end
        finally:
            client.destroy()


def test_a_request_refused_mid_stream_names_its_server(engine, monkeypatch):
    """A streamed request can be refused after its stream began: held at the pause gate while the
    server's memory is released, it reaches the scheduler with nothing to run on, and the server
    ends the stream with an error chunk (as SGLang does) instead of an HTTP status. The client's
    error names the server and the refusal, as for a whole answer's 400."""
    headers = {"Authorization": f"Bearer {KEY}"}
    monkeypatch.setattr(engine, "stream_interval", 3)
    streams = count_streams(monkeypatch)

    def post(addr, route, body=None):
        requests.post(f"http://{addr}{route}", json=body or {}, headers=headers, timeout=60).raise_for_status()

    held = None
    for addr in engine.addrs:
        post(addr, "/pause_generation", {"mode": "in_place"})
    with ThreadPoolExecutor(1) as pool:
        try:
            sent = pool.submit(run, engine, greedy(n=1))
            wait_for(
                lambda: any(server_load(f"http://{a}", headers)["accepted"] for a in engine.addrs),
                "the streamed request held at a paused server's gate",
                60,
            )
            held = next(a for a in engine.addrs if server_load(f"http://{a}", headers)["accepted"])
            post(held, "/release_memory_occupation")
            for addr in engine.addrs:
                post(addr, "/continue_generation")
            with pytest.raises(ServerError, match="released") as err:
                sent.result(timeout=120)
        finally:  # whatever failed, leave the module's servers serving
            for addr in engine.addrs:
                post(addr, "/continue_generation")
            if held is not None:
                post(held, "/resume_memory_occupation")
    assert err.value.addr == held and held in str(err.value)
    assert len(streams) == 1 and "error" in streams[0][-1]  # the refusal came as a chunk, not a status
    assert run(engine, greedy(n=1))[0].output_len == 12  # the server serves again


@pytest.mark.parametrize("mode", ["retract", "abort", "in_place", "in_place_streamed"])
def test_requests_live_through_a_paused_weight_update(engine, models, mode, monkeypatch):
    """Requests in flight when the servers pause for an update finish with every token labelled
    by the version that produced it. abort: the pause aborts them (/abort_request) and waits for
    their answers before /pause_generation (SGLang's waits a second per check while one is out),
    and the client resubmits the rest after continue; retract (the default) and in_place: the
    servers hold them, finish them after continue and report where the version changed. The
    update asks the servers for no flush (the built-in server, like SGLang, refuses one while
    requests are held): the update's flush follows the mode of the pause in effect, not the
    control's own. in_place_streamed: the answers come as a stream a chunk a token
    (rollout.stream_interval), held through the update as whole ones are."""
    assert engine.pause_mode == "retract"  # rollout.pause_mode auto, on built-in servers
    streams = None
    if mode == "in_place_streamed":
        monkeypatch.setattr(engine, "stream_interval", 1)
        streams = count_streams(monkeypatch)
        mode = "in_place"
    count_key = "requests_aborted" if mode == "abort" else "requests_held"
    reqs = [ModelRequest(input_ids=[1, 5, 6], max_new_tokens=160, ignore_eos=True) for _ in range(4)]
    per_server = len(reqs) // len(engine.addrs)  # the client spreads them evenly

    def generated():
        return {a: engine.control.server_info(a)["batching"]["generated_tokens"] for a in engine.addrs}

    def every_request_running():
        return all(engine.control.server_info(a)["load"]["running"] == per_server for a in engine.addrs)

    deadline = time.monotonic() + 300
    with ThreadPoolExecutor(1) as pool:
        try:
            while True:
                engine.control.update_weights(WeightUpdateMeta("disk", path=models[0], version=1))
                start = generated()
                fut = pool.submit(run, engine, reqs)
                # a running request has its first token and is not done...
                seen = wait_for(
                    lambda: (every_request_running() and "running") or (fut.done() and "finished"),
                    "the four requests running on the servers",
                )
                report = engine.control.pause(mode)
                # ...and the pause caught all four still so, unless a fast machine finished one in
                # between: then the round is void, and repeated
                caught = report.get("requests_drained") if mode == "abort" else report[count_key]
                if seen == "running" and caught == len(reqs):
                    break
                engine.control.resume()
                fut.result(timeout=120)
                assert time.monotonic() < deadline, "no pause caught the four requests mid-generation"
            done_at_pause = {a: n - start[a] for a, n in generated().items()}
            assert report["server_pause_s"] >= 0
            if mode == "abort":  # aborted and answered before /pause_generation, asked for retract: none held
                assert report["pause_sent_as_retract"] == 1.0 and report["requests_held"] == 0
                assert report["drain_s"] > 0
                assert engine._open.count == 0
            assert report["requests_in_flight"] == len(reqs)  # /v1/loads, read just before the pause
            with engine.control.weight_update(WeightUpdateMeta("disk", version=2)) as update:  # paused already
                update.load_disk(models[1])
                assert not fut.done()  # waiting for continue, not failed (a failure would also show below)
                if mode != "abort":  # the servers hold them (abort: the client does, until continue)
                    where = "running" if mode == "in_place" else "waiting"
                    assert all(engine.control.server_info(a)["load"][where] == per_server for a in engine.addrs)
                # nothing generated while paused
                assert {a: n - start[a] for a, n in generated().items()} == done_at_pause
            assert ("flush_s" in update.report) == (mode == "abort")  # flushed only when nothing was held
            resps = fut.result(timeout=120)
        finally:  # a failure above must not leave the servers paused for the tests after it
            if engine.control.paused:
                engine.control.resume()
    for r in resps:
        assert r.output_len == 160 and r.stop_reason == "length"
        assert len(r.output_logprobs) == len(r.output_versions) == 160
        assert r.output_versions == sorted(r.output_versions)
        assert set(r.output_versions) == {1, 2}
    # every token generated before the pause is version 1, every later one version 2
    assert sum(r.output_versions.count(1) for r in resps) == sum(done_at_pause.values())
    if streams is not None:  # the answers that lived through the update came a chunk a token
        assert sorted(len(chunks) for chunks in streams)[-len(resps) :] == [160] * len(resps)


def test_distributed_weight_update(engine, models):
    """The trainer side (this process, rank 0) broadcasts model A over gloo while the servers
    receive; afterwards greedy outputs are model A's again."""
    import torch
    from transformers import AutoModelForCausalLM

    engine.control.update_weights(WeightUpdateMeta("disk", path=models[0], version=3))
    expected = run(engine, greedy(1))[0].output_tokens
    engine.control.update_weights(WeightUpdateMeta("disk", path=models[1], version=4))
    assert run(engine, greedy(1))[0].output_tokens != expected
    state = AutoModelForCausalLM.from_pretrained(models[0], dtype=torch.float32).state_dict()
    # the control joins the group beside the servers on first use, then broadcasts the bucket
    meta = WeightUpdateMeta("distributed", version=5, master_port=free_port(), backend="gloo", group_name="test_group")
    with engine.control.weight_update(meta) as update:
        update.load_bucket(list(state.items()))
    assert engine.get_version() == 5
    resp = run(engine, greedy(1))[0]
    assert resp.output_tokens == expected and set(resp.output_versions) == {5}


def test_unreachable_server_is_named_at_setup(models):
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError, match=addr):
        RemoteSGLangEngine.from_pretrained(models[0], server_addrs=[addr], rollout={"setup_timeout_s": 1})


def test_server_going_away_mid_run_names_it(models):
    server = start_server(models[0], extra_args=["--dtype", "float32"], env={"OMP_NUM_THREADS": "1"})
    addr = f"127.0.0.1:{server.port}"
    eng = RemoteSGLangEngine.from_pretrained(
        models[0], server_addrs=[addr], rollout={"request_retries": 1, "request_timeout_s": 60}
    )
    req = ModelRequest(input_ids=[1, 5], max_new_tokens=500, ignore_eos=True)
    try:
        with ThreadPoolExecutor(1) as pool:
            # held in place mid-generation, the request cannot finish before the kill
            (fut,), _ = pause_mid_generation(server.url, lambda: [pool.submit(run, eng, [req])])
            server.proc.kill()
            # a generous bound, only against a hang: the message below tells a noticed
            # disconnect from the request timeout (60 s, "no answer within")
            error = fut.exception(timeout=120)
        assert isinstance(error, ServerError) and addr in str(error), repr(error)
        assert "unreachable" in str(error) or "Disconnected" in str(error)
    finally:
        server.stop()
        eng.destroy()


def test_discovery_from_record_and_environment(engine, tmp_path, monkeypatch):
    """An engine built from a config without server_addrs finds the launcher's record, or the
    environment variable, which takes precedence."""
    from areal.infra.discovery import write_server_addrs

    cfg = engine.config.model_copy(deep=True)
    cfg.rollout.server_addrs = []
    cfg.cluster.fileroot = str(tmp_path)
    monkeypatch.delenv("AREAL_SERVER_ADDRS", raising=False)
    write_server_addrs(cfg.run_dir, engine.addrs)
    with RemoteSGLangEngine(cfg) as found:
        assert found.addrs == engine.addrs
    monkeypatch.setenv("AREAL_SERVER_ADDRS", engine.addrs[1])
    with RemoteSGLangEngine(cfg) as found:
        assert found.addrs == engine.addrs[1:]
        assert run(found, greedy(1))[0].output_len == 12


def test_requests_in_a_shared_session_reuse_their_connections(engine):
    """Inside http.shared_session() (the rollout executor's loop runs in one), requests keep their
    connections alive: one TCP connection per server for sequential requests, not one per request."""
    import aiohttp

    from areal.engine.sglang import http

    created = []

    async def count(session, ctx, params):
        created.append(1)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(count)

    async def go():
        async with http.shared_session(trace_configs=[trace]) as session:
            loop = asyncio.get_running_loop()
            assert http._LOOP_SESSIONS[loop] is session
            for req in greedy(n=6, tokens=2):
                resp = await engine.agenerate(req)
                assert resp.output_len == 2
        assert session.closed and loop not in http._LOOP_SESSIONS

    asyncio.run(go())
    assert len(created) == len(engine.addrs)  # 6 requests over 2 servers, 2 connections


def test_destroy_stops_owned_servers(engine):
    procs = list(engine._own_servers.procs)
    engine.destroy()
    assert all(p.poll() is not None for p in procs)


def test_retries_outlast_a_server_restart_only_when_the_launcher_restarts_servers():
    from areal.config import ExperimentConfig
    from areal.engine.sglang.client import request_retries
    from areal.engine.sglang.http import BACKOFF_S, retries_for

    def cfg(**launcher):
        return ExperimentConfig.model_validate({"launcher": launcher, "rollout": {"request_retries": 2}})

    assert request_retries(cfg()) == 2
    n = request_retries(cfg(restart_failed_servers=True, server_startup_timeout_s=60))
    assert n == retries_for(60) and sum(BACKOFF_S[min(i, len(BACKOFF_S) - 1)] for i in range(n)) >= 60
    trainer_only = cfg(restart_failed_servers=True, rollout_n_nodes=0)  # not the launcher's servers
    assert request_retries(trainer_only) == 2


def test_a_full_server_is_back_pressure_not_an_error(models):
    """Six requests at a server that holds two (one running, one queued): the others are answered
    503 at once, and the client asks again until there is room; every request completes."""
    server = start_server(
        models[0],
        extra_args=["--dtype", "float32", "--max-running-requests", "1", "--max-queued-requests", "1"],
        env={"OMP_NUM_THREADS": "1"},
    )
    eng = RemoteSGLangEngine.from_pretrained(models[0], server_addrs=[server.url], rollout={"request_retries": 0})
    try:
        answers = run(eng, greedy(n=6, tokens=16))
    finally:
        eng.destroy()
        server.stop()
    assert [len(a.output_tokens) for a in answers] == [16] * 6
