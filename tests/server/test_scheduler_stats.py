"""The scheduler's throughput log: one line per period, with the step time and batch size."""

import logging

from areal.server.scheduler import BatchStats, ThroughputLog


def test_throughput_log_reports_the_period_since_the_last_line(caplog, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("areal.server.scheduler.time.monotonic", lambda: clock[0])
    stats = BatchStats()
    log = ThroughputLog(stats, period=10.0)
    for _ in range(4):
        stats.record_decode(8, 0.02)
    stats.generated_tokens += 32
    stats.prefill_steps, stats.prefill_tokens, stats.prefill_s = 1, 40, 0.1
    clock[0] = 105.0
    with caplog.at_level(logging.INFO, logger="areal.server"):
        log.maybe_log(running=8, waiting=2)
        assert not caplog.records  # within the period: nothing yet
        clock[0] = 110.0
        log.maybe_log(running=8, waiting=2)
        clock[0] = 125.0
        log.maybe_log(running=0, waiting=0)  # idle period: no line
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "4 decode steps (20.0 ms each, mean batch 8)" in line
    assert "1 prefills (40 tokens, 0.10s)" in line
    assert "3 gen tok/s" in line  # 32 tokens over 10 s
    assert "forward passes 2% of the time" in line  # (0.08 + 0.1) s of 10 s
    assert stats.as_dict()["decode_s"] == 0.08
