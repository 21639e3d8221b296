"""The SGLang payload builders and parsers, on bodies saved in SGLang's exact format (tests/engine/data)."""

import json
from pathlib import Path

import pytest

from areal.api.inference import ModelRequest
from areal.api.weights import WeightUpdateMeta
from areal.engine.sglang import protocol

DATA = Path(__file__).parent / "data"
FIELDS = json.loads((DATA / "sglang_fields.json").read_text())


def load(name):
    return json.loads((DATA / name).read_text())


def test_generate_payload_uses_only_sglang_keys():
    req = ModelRequest(
        input_ids=[1, 2, 3],
        max_new_tokens=9,
        min_new_tokens=2,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        stop=["\n\n"],
        stop_token_ids=[7],
        ignore_eos=True,
    )
    body = protocol.generate_payload(req, rid="r-1", input_ids=[1, 2, 3, 4], max_new_tokens=8, min_new_tokens=1)
    assert set(body) <= set(FIELDS["GenerateReqInput"])
    assert set(body["sampling_params"]) <= set(FIELDS["SamplingParams"])
    assert protocol.SAMPLING_KEYS <= set(FIELDS["SamplingParams"])
    assert protocol.GENERATE_KEYS <= set(FIELDS["GenerateReqInput"])
    assert body["input_ids"] == [1, 2, 3, 4] and body["rid"] == "r-1"
    assert body["return_logprob"] is True and body["stream"] is False
    assert body["sampling_params"] == {
        "max_new_tokens": 8,
        "min_new_tokens": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "stop": ["\n\n"],
        "stop_token_ids": [7],
        "ignore_eos": True,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    json.dumps(body)  # plain JSON types only


@pytest.mark.parametrize(
    "builder, fields",
    [
        (lambda: protocol.disk_update_payload("/ckpt", 3), "UpdateWeightFromDiskReqInput"),
        (
            lambda: protocol.init_group_payload(
                WeightUpdateMeta("distributed", master_port=1234), rank_offset=1, world_size=3
            ),
            "InitWeightsUpdateGroupReqInput",
        ),
        (
            lambda: protocol.distributed_update_payload(
                WeightUpdateMeta("distributed", version=2, names=["w"], dtypes=["float32"], shapes=[[2, 2]])
            ),
            "UpdateWeightsFromDistributedReqInput",
        ),
        (lambda: protocol.pause_payload("retract"), "PauseGenerationReqInput"),
        (protocol.continue_payload, "ContinueGenerationReqInput"),
        (protocol.abort_all_payload, "AbortReq"),
        (lambda: protocol.load_lora_payload("v1", "/w/v1"), "LoadLoRAAdapterReqInput"),
        (lambda: protocol.unload_lora_payload("v1"), "UnloadLoRAAdapterReqInput"),
        (lambda: protocol.weight_version_payload(3), "UpdateWeightVersionReqInput"),
        (lambda: protocol.destroy_group_payload("g"), "DestroyWeightsUpdateGroupReqInput"),
        (
            lambda: protocol.tensor_update_payload(["AAAA"], version=3),
            "UpdateWeightsFromTensorReqInput",
        ),
        (lambda: protocol.memory_payload(["kv_cache"]), "ReleaseMemoryOccupationReqInput"),
        (lambda: protocol.memory_payload(None, protocol.RESUME_MEMORY), "ResumeMemoryOccupationReqInput"),
        (
            lambda: protocol.start_profile_payload("/r/server-0", "step3", with_stack=False, record_shapes=False),
            "ProfileReq",
        ),
    ],
)
def test_control_payloads_use_only_sglang_keys(builder, fields):
    assert set(builder()) <= set(FIELDS[fields])


def test_generate_payload_names_the_lora_adapter_only_when_given():
    req = ModelRequest(input_ids=[1, 2], max_new_tokens=4)
    kw = dict(rid="r", input_ids=[1, 2], max_new_tokens=4, min_new_tokens=0)
    assert "lora_path" not in protocol.generate_payload(req, **kw)
    assert protocol.generate_payload(req, lora_path="v3", **kw)["lora_path"] == "v3"
    assert protocol.weight_version_payload(3) == {"new_version": "3", "abort_all_requests": False}


def test_disk_update_sends_version_as_string_only_when_given():
    assert protocol.disk_update_payload("/m", 4) == {
        "model_path": "/m",
        "abort_all_requests": False,
        "flush_cache": False,
        "weight_version": "4",
    }
    assert "weight_version" not in protocol.disk_update_payload("/m", None)


def test_init_group_ranks():
    body = protocol.init_group_payload(
        WeightUpdateMeta("distributed", master_address="10.0.0.1", master_port=29600, backend="nccl"),
        rank_offset=3,
        world_size=5,
    )
    assert body == {
        "master_address": "10.0.0.1",
        "master_port": 29600,
        "rank_offset": 3,
        "world_size": 5,
        "group_name": "areal_weight_update",
        "backend": "nccl",
    }


def test_distributed_payload_checks_lengths():
    with pytest.raises(ValueError, match="match one to one"):
        protocol.distributed_update_payload(WeightUpdateMeta("distributed", names=["a"], dtypes=[], shapes=[]))


def test_pause_mode_is_checked():
    assert protocol.pause_payload("abort") == {"mode": "abort"}
    with pytest.raises(ValueError, match="rollout.pause_mode"):
        protocol.pause_payload("stop")


def test_parse_stop_on_eos_keeps_the_stop_token():
    r = protocol.parse_generate(load("generate_stop_eos.json"))
    assert r.output_ids == [14, 15, 2]
    assert r.output_logprobs == [-0.25, -1.5, -0.0625]
    assert r.stop_reason == "stop"
    assert r.weight_version is None  # "default"


def test_parse_stop_string_length_and_versions():
    r = protocol.parse_generate(load("generate_stop_str.json"))
    assert (r.stop_reason, r.weight_version, r.output_ids) == ("stop", 3, [10, 22, 22])
    r = protocol.parse_generate(load("generate_length.json"))
    assert (r.stop_reason, r.weight_version, len(r.output_logprobs)) == ("length", 12, 4)


def test_parse_aborts_with_and_without_tokens():
    r = protocol.parse_generate(load("generate_abort_partial.json"))
    assert (r.stop_reason, r.output_ids, r.weight_version, r.message) == ("abort", [20, 21], 4, "Aborted")
    r = protocol.parse_generate(load("generate_abort_before_prefill.json"))
    assert (r.stop_reason, r.output_ids, r.output_logprobs) == ("abort", [], [])


def test_parse_rejects_malformed_bodies():
    with pytest.raises(protocol.ProtocolError, match="meta_info"):
        protocol.parse_generate({"detail": "Not Found"})
    body = load("generate_length.json")
    del body["meta_info"]["output_token_logprobs"]
    with pytest.raises(protocol.ProtocolError, match="logprobs"):
        protocol.parse_generate(body)
    body = load("generate_length.json")
    body["meta_info"]["finish_reason"] = None
    with pytest.raises(protocol.ProtocolError, match="unfinished"):
        protocol.parse_generate(body)


def test_parse_output_version_spans_of_the_builtin_server():
    body = load("generate_length.json")  # 4 tokens; SGLang's answer has no spans
    assert protocol.parse_generate(body).output_versions is None
    body["meta_info"]["output_version_spans"] = [[0, "11"], [3, "12"]]
    assert protocol.parse_generate(body).output_versions == [11, 11, 11, 12]
    body["meta_info"]["output_version_spans"] = [[0, "default"], [1, "1"]]
    assert protocol.parse_generate(body).output_versions == [None, 1, 1, 1]
    for bad in ([], [[1, "1"]], [[0, "1"], [0, "2"]], [[0, "1", 2]], "0:1"):
        body["meta_info"]["output_version_spans"] = bad
        with pytest.raises(protocol.ProtocolError, match="output_version_spans"):
            protocol.parse_generate(body)


def test_pause_mode_auto_per_server_program():
    from areal.infra.pause import resolve_pause_mode

    assert resolve_pause_mode("auto", "builtin") == "retract"
    assert resolve_pause_mode("auto", "sglang") == "abort"
    assert resolve_pause_mode("auto", None) == "abort"  # unknown program: the mode that holds nothing
    assert resolve_pause_mode("in_place", "sglang") == "in_place"  # an explicit mode is kept
    with pytest.raises(ValueError, match="rollout.pause_mode"):
        resolve_pause_mode("hold", "builtin")


def test_stream_interval_auto_streams_where_sglang_holds_requests():
    """auto streams every AUTO_STREAM_INTERVAL tokens under retract and in_place on servers that may
    be SGLang (one version per answer); abort labels every token by resubmitting, the built-in
    server reports per-token versions: whole answers there. A number or null is kept."""
    from areal.infra.pause import AUTO_STREAM_INTERVAL, resolve_stream_interval

    for kind in ("sglang", None):
        assert resolve_stream_interval("auto", "in_place", kind) == AUTO_STREAM_INTERVAL
        assert resolve_stream_interval("auto", "retract", kind) == AUTO_STREAM_INTERVAL
        assert resolve_stream_interval("auto", "abort", kind) is None
    assert resolve_stream_interval("auto", "retract", "builtin") is None
    assert resolve_stream_interval(4, "abort", "sglang") == 4
    assert resolve_stream_interval(None, "in_place", "sglang") is None


def test_server_program_from_server_info_versions():
    from areal.engine.sglang.client import program_kind

    assert program_kind(["areal-builtin", "areal-builtin"]) == "builtin"
    assert program_kind(["0.5.16"]) == "sglang"
    assert program_kind(["areal-builtin", "0.5.16"]) is None  # mixed: no single answer
    assert program_kind(["areal-builtin", None]) is None


def test_weight_updates_never_ask_the_server_to_flush():
    """SGLang asserts (and its scheduler dies) when a flush asked inside an update is refused."""
    meta = WeightUpdateMeta("distributed", version=2, names=["w"], dtypes=["float32"], shapes=[[2, 2]])
    for body in (
        protocol.disk_update_payload("/m", 1),
        protocol.distributed_update_payload(meta),
        protocol.tensor_update_payload(["AAAA"], version=1),
    ):
        assert body["flush_cache"] is False


def test_generate_names_its_cache_namespace_as_extra_key():
    from areal.infra.pause import cache_namespace

    req = ModelRequest(input_ids=[1, 2])
    body = protocol.generate_payload(
        req, rid="r", input_ids=[1, 2], max_new_tokens=4, min_new_tokens=0, cache_namespace=cache_namespace(3)
    )
    assert body["extra_key"] == "weights-v3"
    assert "extra_key" in FIELDS["GenerateReqInput"]
    assert "extra_key" not in protocol.generate_payload(req, rid="r", input_ids=[1], max_new_tokens=1, min_new_tokens=0)


def test_flush_route_passes_the_drain_timeout():
    assert protocol.flush_route(30) == "/flush_cache?timeout=30"
    assert "timeout_s" in FIELDS["FlushCacheReqInput"]


def test_token_versions_prefer_spans_then_the_final_version_then_the_clients():
    from areal.engine.sglang.client import token_versions

    def result(final, per_token=None):
        return protocol.GenerateResult([5, 6, 7], [-1.0] * 3, "length", final, "", per_token)

    assert token_versions(result(4, [3, 3, 4]), sent_version=3) == [3, 3, 4]
    assert token_versions(result(4, [None, 4, 4]), sent_version=3) == [3, 4, 4]
    assert token_versions(result(4), sent_version=3) == [4, 4, 4]
    assert token_versions(result(None), sent_version=3) == [3, 3, 3]


def test_parse_weight_version():
    assert [protocol.parse_weight_version(v) for v in ("7", 7, "default", None, True, "-1")] == [
        7,
        7,
        None,
        None,
        None,
        -1,
    ]


def test_parse_success():
    assert "Weight version updated to 1" in protocol.parse_success("/u", load("update_weights_from_disk_ok.json"))
    with pytest.raises(RuntimeError, match="/nope"):
        protocol.parse_success("/u", load("update_weights_from_disk_fail.json"))
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_success("/u", load("pause_generation_ok.json"))


def test_batching_counters_ask_only_builtin_servers(monkeypatch):
    from areal.engine.sglang.client import RemoteSGLangEngine

    engine = RemoteSGLangEngine.__new__(RemoteSGLangEngine)  # no servers: only the guard is tested
    engine.addrs = ["127.0.0.1:1", "127.0.0.1:2"]
    engine._control = type("Control", (), {})()
    monkeypatch.setattr(engine._control, "server_info", lambda addr: pytest.fail("asked a server"), raising=False)
    for programs in ([], ["areal-builtin", "0.5.2"], ["areal-builtin", None]):
        engine._server_programs = programs
        assert engine.batching_counters() == {}
    engine._server_programs = ["areal-builtin", "areal-builtin"]
    monkeypatch.setattr(
        engine._control,
        "server_info",
        lambda addr: {"batching": {"prefill_steps": 2, "decode_steps": 10, "decode_rows": 40, "generated_tokens": 42}},
        raising=False,
    )
    counters = engine.batching_counters()
    assert counters["decode_steps"] == 20 and counters["decode_rows"] == 80 and counters["prefill_s"] == 0


def test_tensor_update_payload_one_text_per_rank_and_the_version_as_text():
    body = protocol.tensor_update_payload(["a", "b"], version=4)
    assert body == {
        "serialized_named_tensors": ["a", "b"],
        "load_format": None,
        "flush_cache": False,
        "abort_all_requests": False,
        "weight_version": "4",
    }
    assert "weight_version" not in protocol.tensor_update_payload(["a"], version=None)
    with pytest.raises(ValueError, match="one serialized text per tensor-parallel rank"):
        protocol.tensor_update_payload([], version=1)


def test_memory_payload_tags():
    assert protocol.memory_payload(None) == {"tags": None}
    assert protocol.memory_payload(["weights", "kv_cache"]) == {"tags": ["weights", "kv_cache"]}
    with pytest.raises(ValueError, match="cuda_graph"):
        protocol.memory_payload(["cuda_graph"])


def test_model_info_version():
    assert protocol.parse_model_info_version({"weight_version": "7", "model_path": "/m"}) == 7
    assert protocol.parse_model_info_version({"weight_version": "default"}) is None
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_model_info_version(["not", "an", "object"])


def test_parse_loads_sums_running_and_waiting_over_schedulers():
    assert protocol.LOADS.startswith("/v1/loads?include=core")
    assert protocol.parse_loads(load("v1_loads_core.json")) == 37 + 5 + 40  # two data-parallel ranks
    assert protocol.parse_loads({"timestamp": "t", "version": "0.5.16", "loads": []}) is None
    assert protocol.parse_loads({"detail": "Not Found"}) is None
    body = load("v1_loads_core.json")
    del body["loads"][1]["num_waiting_reqs"]
    assert protocol.parse_loads(body) is None  # one rank unreadable: no count, not half of one


def _chunk(ids, version, finish=None, logprob=-0.5):
    """A streamed /generate chunk as SGLang sends it (the output so far, the server's version)."""
    meta = {
        "finish_reason": finish,
        "completion_tokens": len(ids),
        "weight_version": version,
        "output_token_logprobs": [[logprob, t, None] for t in ids],
    }
    return {"output_ids": list(ids), "meta_info": meta}


def test_generate_payload_asks_for_a_stream_in_chunks_of_the_interval():
    req = ModelRequest(input_ids=[1, 2], max_new_tokens=4)
    body = protocol.generate_payload(
        req, rid="r", input_ids=[1, 2], max_new_tokens=4, min_new_tokens=0, stream_interval=8
    )
    assert body["stream"] is True and body["sampling_params"]["stream_interval"] == 8
    assert set(body["sampling_params"]) <= set(FIELDS["SamplingParams"])
    whole = protocol.generate_payload(req, rid="r", input_ids=[1, 2], max_new_tokens=4, min_new_tokens=0)
    assert whole["stream"] is False and "stream_interval" not in whole["sampling_params"]


def test_a_stream_labels_each_chunks_tokens_with_the_version_it_was_sent_under():
    """An in_place answer on SGLang: two chunks sent under version 3, the rest under 4; the
    tokens each chunk brought (past the previous chunk's count) carry its version."""
    ids = [5, 6, 7, 8, 9, 10]
    chunks = [_chunk(ids[:2], "3"), _chunk(ids[:3], "3"), _chunk(ids[:5], "4"), _chunk(ids, "4", {"type": "length"})]
    result = protocol.parse_generate_stream(chunks)
    assert result.output_ids == ids and result.output_logprobs == [-0.5] * 6 and result.stop_reason == "length"
    assert result.output_versions == [3, 3, 3, 4, 4, 4] and result.weight_version == 4
    # "default" (no update yet) is no integer: the client puts its own version there
    result = protocol.parse_generate_stream([_chunk(ids[:1], "default"), _chunk(ids[:2], "5", {"type": "stop"})])
    assert result.output_versions == [None, 5]


def test_incremental_chunks_are_joined_and_spans_win_over_chunk_labels():
    """SGLang's --incremental-streaming-output sends only each chunk's new tokens (completion_tokens
    still counts them all); the built-in server's output_version_spans are exact and win."""
    first, rest = _chunk([5, 6], "3", logprob=-0.1), _chunk([7], "4", {"type": "length"}, logprob=-0.2)
    rest["meta_info"]["completion_tokens"] = 3
    result = protocol.parse_generate_stream([first, rest])
    assert result.output_ids == [5, 6, 7] and result.output_logprobs == [-0.1, -0.1, -0.2]
    assert result.output_versions == [3, 3, 4]
    last = _chunk([5, 6, 7], "4", {"type": "length"})
    last["meta_info"]["output_version_spans"] = [[0, "3"], [1, "4"]]
    assert protocol.parse_generate_stream([_chunk([5, 6], "3"), last]).output_versions == [3, 4, 4]


@pytest.mark.parametrize(
    "chunks, needle",
    [
        ([], "without a chunk"),
        ([{"error": {"message": "boom"}}], "boom"),
        ([{"output_ids": [1]}], "without meta_info"),
        ([_chunk([1, 2], "3"), _chunk([1], "3", {"type": "length"})], "went down"),
        ([_chunk([1], "3")], "unfinished"),
    ],
)
def test_malformed_streams_are_protocol_errors(chunks, needle):
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.parse_generate_stream(chunks)
