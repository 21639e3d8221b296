"""actor.max_tokens_per_mb=auto (areal/engine/fsdp/mb_budget.py): the arithmetic, the probe and
measurement bookkeeping against a fake device memory, and the real engine on CPU, where "auto" is
a fixed 16384 and the budget used shows in the train stats. The CUDA side: tests/engine/gpu."""

import pytest
import torch

from areal.config.actor import AUTO_CPU_TOKENS, AUTO_PROBE_TOKENS
from areal.engine.fsdp import packing
from areal.engine.fsdp.mb_budget import (
    AutoBudgetOutOfMemory,
    Measurement,
    TokenBudget,
    budget_from_memory,
    usable_bytes,
)
from tests.engine.test_fsdp_helpers import make_batch, nll_loss, one_torch_thread, token_weight
from tests.engine.test_fsdp_helpers import one_rank_engine as _engine

MiB = 2**20


class FakeMemory:
    """Device memory readings set by the test: `added` is what the next measured pass adds."""

    def __init__(self, free: int, added: int):
        self.free, self.added, self.base, self.resets = free, added, 7 * MiB, 0

    def free_bytes(self) -> int:
        return self.free

    def allocated(self) -> int:
        return self.base

    def reset_peak(self) -> None:
        self.resets += 1

    def peak(self) -> int:
        return self.base + self.added


# ---- the arithmetic -----------------------------------------------------------------------------
def test_budget_is_free_memory_after_headroom_over_bytes_per_token_in_1024s():
    # 10 GiB, 10% headroom, 100 KiB a token: 94371.84 tokens -> 92 x 1024
    assert budget_from_memory(10 * 2**30, 100 * 1024, 0.1, longest=1) == 92 * 1024
    assert budget_from_memory(10 * 2**30, 100 * 1024, 0.0, longest=1) == 102 * 1024  # 104857.6 tokens
    assert budget_from_memory(2047, 1, 0.0, longest=1) == 1024  # rounded down, not to nearest


def test_budget_never_below_the_longest_sequence():
    assert budget_from_memory(1000 * MiB, MiB, 0.1, longest=5000) == 5000  # 900 tokens fit: too few
    assert budget_from_memory(0, MiB, 0.1, longest=3) == 3
    assert budget_from_memory(-5, MiB, 0.1, longest=3) == 3  # a reading below zero counts as none


def test_budget_refuses_a_non_positive_cost_per_token():
    with pytest.raises(ValueError, match="bytes_per_token"):
        budget_from_memory(MiB, 0, 0.1, longest=1)


def test_usable_memory_leaves_out_the_allocators_split_fragments():
    # the H100 out-of-memory: 2.33 GiB free on the device, 8.64 GiB reserved but unallocated, all of
    # it fragments of segments holding live tensors -> only the device's free memory is usable
    GiB = 2**30
    assert usable_bytes(2386 * MiB, 34 * GiB, 25966 * MiB, 8850 * MiB) == 2386 * MiB
    # whole cached blocks count: the allocator hands them back before it fails
    assert usable_bytes(2 * GiB, 30 * GiB, 20 * GiB, 3 * GiB) == 9 * GiB
    assert usable_bytes(2 * GiB, 10 * GiB, 10 * GiB, 0) == 2 * GiB
    assert usable_bytes(2 * GiB, 10 * GiB, 9 * GiB, 5 * GiB) == 2 * GiB  # never below the device's own


def test_usable_memory_beside_colocated_servers_stops_at_the_trainers_share():
    # the H100 run whose SGLang sampler ran out of memory: 79 GiB, servers at 0.5; a trainer holding
    # 30 GiB with 8 GiB of the device free may count on 0.45 x 79 - 30 = 5.55 GiB of it, not 8
    GiB = 2**30
    limit = int(79 * GiB * 0.45)
    assert usable_bytes(8 * GiB, 30 * GiB, 28 * GiB, 0, limit=limit) == limit - 30 * GiB + 2 * GiB
    # at or past its share only its own whole cached blocks are left; never below nothing
    assert usable_bytes(8 * GiB, 40 * GiB, 38 * GiB, 1 * GiB, limit=limit) == 1 * GiB
    # a share larger than what is free changes nothing
    assert usable_bytes(2 * GiB, 10 * GiB, 9 * GiB, 0, limit=limit) == 3 * GiB


def test_measurement_charges_the_pass_to_its_largest_microbatch():
    assert Measurement(tokens=4096, added_bytes=4096 * 300).bytes_per_token == 300
    assert Measurement(tokens=10, added_bytes=0).bytes_per_token == 0.1  # never 0: budget_from_memory refuses it


# ---- fixed budgets -----------------------------------------------------------------------------
def test_a_fixed_budget_is_used_as_given_and_never_measured():
    memory = FakeMemory(free=10 * 2**30, added=MiB)
    budget = TokenBudget(300, 0.1, memory)
    assert budget.plan("train", [10, 20]) == (300, 1)
    with budget.measure("train", [30]):
        pass
    assert memory.resets == 0 and budget.estimates == {} and budget.used == {"train": 300}


def test_auto_without_device_memory_is_the_documented_cpu_budget():
    budget = TokenBudget("auto", 0.1, None)
    assert AUTO_CPU_TOKENS == 16384
    assert budget.plan("forward", [10, 20]) == (16384, 1)
    assert budget.plan("train", [50_000]) == (16384, 1)  # packing gives the long sequence its own bin
    with budget.measure("train", [30]):
        pass
    assert budget.estimates == {}


# ---- measured budgets (fake device memory) ----------------------------------------------------
def test_first_pass_of_each_kind_is_a_probe_in_two_microbatches_then_measured():
    memory = FakeMemory(free=10 * 2**30, added=2048 * 100 * 1024)  # the probe pass: 100 KiB a token
    budget = TokenBudget("auto", 0.1, memory)
    assert budget.plan("train", [900, 800, 700]) == (AUTO_PROBE_TOKENS, 2)
    assert budget.plan("train", [9000]) == (9000, 1)  # a longer sequence: never split, one sequence
    with budget.measure("train", [2048, 400]):
        pass
    assert budget.estimates["train"] == Measurement(2048, 2048 * 100 * 1024)
    assert memory.resets == 1
    assert budget.plan("train", [900, 800]) == (92 * 1024, 1)  # as computed by hand above
    assert budget.used["train"] == 92 * 1024
    # the forward pass has its own estimate: still a probe
    assert budget.plan("forward", [900, 800]) == (AUTO_PROBE_TOKENS, 2)


def test_budget_follows_the_free_memory_of_each_pass():
    memory = FakeMemory(free=10 * 2**30, added=1024 * 100 * 1024)
    budget = TokenBudget("auto", 0.1, memory)
    budget.plan("forward", [10, 10])
    with budget.measure("forward", [1024]):
        pass
    first, _ = budget.plan("forward", [10])
    memory.free //= 2  # a colocated server took half of it
    second, _ = budget.plan("forward", [10])
    assert first == 92 * 1024 and second == 46 * 1024  # 47185.92 tokens -> 46 x 1024


def test_a_pass_is_measured_again_only_with_a_larger_microbatch():
    memory = FakeMemory(free=10 * 2**30, added=1000 * 400)
    budget = TokenBudget("auto", 0.1, memory)
    budget.plan("train", [600, 400])
    with budget.measure("train", [600, 400]):
        pass
    assert budget.estimates["train"].tokens == 600 and memory.resets == 1
    memory.added = 10**12  # would change the estimate if it were read
    with budget.measure("train", [600, 100]):  # no larger than the measured one: not measured
        pass
    assert budget.estimates["train"] == Measurement(600, 1000 * 400) and memory.resets == 1
    memory.added = 6000 * 300
    with budget.measure("train", [6000]):  # larger: measured, the tighter estimate replaces it
        pass
    assert budget.estimates["train"] == Measurement(6000, 6000 * 300) and memory.resets == 2
    with budget.measure("train", [0]):  # a rank whose micro-batches are all fillers: nothing to learn
        pass
    assert memory.resets == 2


def test_a_budget_that_cuts_a_pass_into_many_microbatches_is_reported_once(caplog):
    """Beside a server, auto may leave the trainer a few thousand tokens a micro-batch: the first
    such pass of each kind says so, with what frees memory (checkpointing only where it is off)."""
    memory = FakeMemory(free=2**30, added=1024 * 300 * 1024)  # 300 KiB a token: 1 GiB holds 3,072
    budget = TokenBudget("auto", 0.1, memory, checkpointing=False)
    budget.plan("train", [500, 500])
    with budget.measure("train", [1024]):
        pass
    with caplog.at_level("WARNING", logger="areal.fsdp"):
        assert budget.plan("train", [500] * 40)[0] == 3 * 1024  # 20,000 tokens: 7 micro-batches
        assert not caplog.records
        assert budget.plan("train", [500] * 100)[0] == 3 * 1024  # 50,000 tokens: 17
        assert budget.plan("train", [500] * 200)[0] == 3 * 1024  # reported once
    (record,) = caplog.records
    text = record.getMessage()
    assert "actor.max_tokens_per_mb=auto: train passes get 3072-token micro-batches" in text
    assert "17 for this pass's 50000 tokens" in text and "300 KiB a token" in text
    assert "actor.gradient_checkpointing=true" in text and "sglang.mem_fraction_static" in text
    assert budget.cramped == {"train": 17}
    # with checkpointing on, and for the forward pass, only the memory is suggested
    budget = TokenBudget("auto", 0.1, memory, checkpointing=True)
    for kind in ("train", "forward"):
        budget.plan(kind, [500, 500])
        with budget.measure(kind, [1024]):
            pass
    caplog.clear()
    with caplog.at_level("WARNING", logger="areal.fsdp"):
        budget.plan("train", [500] * 100)
        budget.plan("forward", [500] * 100)
    assert [r.getMessage().split(" passes")[0][-7:] for r in caplog.records] == [": train", "forward"]
    assert not any("gradient_checkpointing" in r.getMessage() for r in caplog.records)


def test_out_of_memory_names_the_setting_and_what_to_set_instead():
    memory = FakeMemory(free=10 * 2**30, added=2048 * 100 * 1024)
    budget = TokenBudget("auto", 0.1, memory)
    budget.plan("train", [3000, 3000])
    with pytest.raises(AutoBudgetOutOfMemory) as probe:
        with budget.measure("train", [3000, 3000]):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "probe budget of 4096" in str(probe.value) and "actor.max_tokens_per_mb=auto" in str(probe.value)
    assert "e.g. 2048" in str(probe.value)
    assert isinstance(probe.value, torch.OutOfMemoryError)  # callers that catch OOM still do
    assert "Tried to allocate" in str(probe.value.__cause__)  # the allocator's own message is kept
    assert "train" not in budget.estimates  # a failed pass records nothing
    with budget.measure("train", [2048]):
        pass
    measured, _ = budget.plan("train", [3000])
    with pytest.raises(AutoBudgetOutOfMemory) as later:
        with budget.measure("train", [measured]):
            raise torch.OutOfMemoryError("CUDA out of memory")
    text = str(later.value)
    assert f"measured budget of {measured}" in text and f"e.g. {measured // 2 // 1024 * 1024}" in text
    assert "actor.mb_memory_headroom (now 0.1)" in text
    with pytest.raises(ValueError, match="not memory"):  # other errors pass through untouched
        with budget.measure("train", [10]):
            raise ValueError("not memory")


# ---- the real engine on CPU -------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def test_auto_on_cpu_trains_at_16384_and_reports_the_budget(tiny_model_dir):
    batch = make_batch(3)
    engine = _engine(tiny_model_dir, max_tokens_per_mb="auto")
    try:
        assert engine.config.max_tokens_per_mb == "auto" and not engine.mb_budget.measured
        engine.forward(batch)
        stats = engine.train_batch(batch, nll_loss, token_weight)
    finally:
        engine.destroy()
    assert stats["mb_token_budget"] == stats["mb_token_budget_forward"] == 16384.0
    assert stats["n_microbatches"] == 1.0  # 8 short sequences fit one micro-batch of 16384 tokens
    assert torch.isfinite(torch.tensor(stats["loss"]))


def test_a_fixed_budget_is_reported_as_given(tiny_model_dir):
    batch = make_batch(3)
    engine = _engine(tiny_model_dir, max_tokens_per_mb=30)
    try:
        stats = engine.train_batch(batch, nll_loss, token_weight)
    finally:
        engine.destroy()
    assert stats["mb_token_budget"] == 30.0 and "mb_token_budget_forward" not in stats  # no forward yet
    assert stats["n_microbatches"] >= 2


def test_engine_probes_then_packs_by_the_measured_budget(tiny_model_dir):
    """The engine's passes go through plan and measure with their kinds: a fake device memory in
    place of CUDA's, the tiny model on CPU."""
    batch = make_batch(3, n=6)
    lengths = packing.sequence_lengths(batch["attention_mask"])
    probe_bins = packing.allocate(lengths, AUTO_PROBE_TOKENS, min_count=2)
    largest = max(sum(lengths[i] for i in b) for b in probe_bins)
    engine = _engine(tiny_model_dir, max_tokens_per_mb="auto")
    # each probe adds 64 bytes per token of its largest micro-batch; 80,000 free bytes then hold
    # 1125 tokens after 10% headroom: a budget of 1024
    memory = FakeMemory(free=80_000, added=64 * largest)
    engine.mb_budget = TokenBudget("auto", 0.1, memory)
    try:
        engine.forward(batch)
        probe = engine.train_batch(batch, nll_loss, token_weight)
        estimates = dict(engine.mb_budget.estimates)
        measured = engine.train_batch(batch, nll_loss, token_weight)
        memory.free = 1024  # 14 tokens: below every sequence
        tight = engine.train_batch(batch, nll_loss, token_weight)
    finally:
        engine.destroy()
    assert estimates == {"forward": Measurement(largest, 64 * largest), "train": Measurement(largest, 64 * largest)}
    assert probe["mb_token_budget"] == probe["mb_token_budget_forward"] == AUTO_PROBE_TOKENS
    assert probe["n_microbatches"] == 2  # the probe packs in two, though one would hold the batch
    assert measured["mb_token_budget"] == 1024 and measured["n_microbatches"] == 1
    assert measured["mb_token_budget_forward"] == AUTO_PROBE_TOKENS  # the latest forward pass's
    assert tight["mb_token_budget"] == max(lengths)  # never below the longest sequence
    assert tight["n_microbatches"] == len(packing.allocate(lengths, max(lengths))) > 2
    # the measured pass's one micro-batch beat the probe's largest: measured again (the fake memory
    # reported the same bytes, now over all the batch's tokens); the tight pass's did not
    assert engine.mb_budget.estimates == {**estimates, "train": Measurement(sum(lengths), 64 * largest)}
    assert all(torch.isfinite(torch.tensor(s["loss"])) for s in (probe, measured, tight))


def test_out_of_memory_in_the_engine_names_the_setting(tiny_model_dir):
    batch = make_batch(3)
    engine = _engine(tiny_model_dir, max_tokens_per_mb="auto")
    engine.mb_budget = TokenBudget("auto", 0.1, FakeMemory(free=10 * 2**30, added=MiB))

    def oom_loss(logprobs, entropy, mb):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    try:
        with pytest.raises(AutoBudgetOutOfMemory, match=r"train pass at the probe budget of 4096.*max_tokens_per_mb"):
            engine.train_batch(batch, oom_loss, token_weight)
    finally:
        engine.destroy()
