"""scripts/bench_stream_parse.py builds SGLang's streamed answer in both forms and parses each back
through the client's path to the same answer."""

import asyncio

from scripts.bench_stream_parse import _Content, main, sse_body


def test_every_form_parses_back_to_the_whole_answer(tmp_path):
    from areal.engine.sglang.http import read_events
    from areal.engine.sglang.protocol import parse_generate_stream

    whole = None
    for interval, incremental in [(1, False), (5, False), (5, True), (64, True)]:
        events = asyncio.run(read_events(_Content(sse_body(37, interval, incremental), 100)))
        assert len(events) == -(-37 // interval)  # a chunk every `interval` tokens and one at the end
        result = parse_generate_stream(events)
        assert len(result.output_ids) == 37 and result.output_versions == [0] * 37
        whole = whole or result
        assert (result.output_ids, result.output_logprobs) == (whole.output_ids, whole.output_logprobs)


def test_report_has_a_row_per_form_and_incremental_chunks_are_smaller(tmp_path):
    report = main(["--out", str(tmp_path / "r.json"), "--tokens", "24", "--intervals", "1", "8", "--repeats", "2"])
    rows = {r["form"]: r for r in report["rows"]}
    assert list(rows) == ["whole", "stream1", "stream8", "stream1_incr", "stream8_incr"]
    assert rows["stream1"]["bytes"] > rows["stream8"]["bytes"] > rows["whole"]["bytes"]
    assert rows["stream1_incr"]["bytes"] < rows["stream1"]["bytes"]
    assert all(r["cpu_ms_per_answer"] > 0 for r in rows.values())
