import pytest

from areal.config.parallel import ParallelStrategyError, parse_parallel


@pytest.mark.parametrize(
    "spec, dp, tp, rep",
    [
        ("fsdp:d4", 4, 1, 1),
        ("fsdp:d2t2", 2, 2, 1),
        ("fsdp:d4r2", 4, 1, 2),
        ("fsdp:t2d2", 2, 2, 1),
        ("sglang:d4t1", 4, 1, 1),
        ("sglang:t2", 1, 2, 1),
    ],
)
def test_valid_strategies(spec, dp, tp, rep):
    s = parse_parallel(spec)
    assert (s.dp, s.tp, s.replicate) == (dp, tp, rep)
    assert s.world_size == dp * tp
    assert s.shard == dp // rep


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("fsdp", "expected '<backend>:<dims>'"),
        ("fsdp:", "cannot parse"),
        ("fsdp:d", "cannot parse"),
        ("fsdp:d2x", "cannot parse"),
        ("fsdp:d0", "must be >= 1"),
        ("fsdp:d2d2", "appears twice"),
        ("sglang:r2", "not allowed for sglang"),
        ("megatron:d2", "not one of"),
        ("fsdp:d3r2", "must divide"),
    ],
)
def test_malformed_strategies_name_the_problem(spec, fragment):
    with pytest.raises(ParallelStrategyError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse_parallel(spec)


def test_backend_restriction():
    with pytest.raises(ParallelStrategyError, match="not one of"):
        parse_parallel("sglang:d2", allowed_backends=("fsdp",))
