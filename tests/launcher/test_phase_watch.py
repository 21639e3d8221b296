"""launcher/phase_watch.py on real phase files, their times set with os.utime and read against a
clock the test moves (the end-to-end run is tests/launcher/test_hangs.py)."""

from __future__ import annotations

import os

from launcher.phase_watch import PhaseWatch, any_phase_since, phase_stamps


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_phase(logs, name: str, text: str, at: float) -> None:
    path = logs / f"{name}.phase"
    path.write_text(text + "\n")
    os.utime(path, (at, at))


def test_ages_are_phase_file_ages_oldest_first(tmp_path):
    clock = Clock(1000.0)
    watch = PhaseWatch(tmp_path, ["trainer-0", "trainer-1"], timeout_s=100, clock=clock)
    write_phase(tmp_path, "trainer-0", "step 3 train", 1010.0)
    write_phase(tmp_path, "trainer-1", "step 3 rollout", 1005.0)
    clock.now = 1050.0
    ages = watch.ages()
    assert [(a.name, a.phase, a.seconds) for a in ages] == [
        ("trainer-1", "step 3 rollout", 45.0),
        ("trainer-0", "step 3 train", 40.0),
    ]
    assert watch.overdue(ages) is None


def test_start_up_and_an_earlier_attempts_file_are_not_watched(tmp_path):
    write_phase(tmp_path, "trainer-0", "step 9 eval", 500.0)  # a recovered run's first attempt
    clock = Clock(1000.0)
    watch = PhaseWatch(tmp_path, ["trainer-0", "trainer-1"], timeout_s=100, clock=clock)
    clock.now = 5000.0
    assert watch.ages() == []  # trainer-1 has no file at all
    write_phase(tmp_path, "trainer-0", "step 10 rollout", 4990.0)
    assert [(a.phase, a.seconds) for a in watch.ages()] == [("step 10 rollout", 10.0)]


def test_overdue_names_the_longest_past_the_timeout(tmp_path):
    clock = Clock(0.0)
    watch = PhaseWatch(tmp_path, ["trainer-0", "trainer-1"], timeout_s=100, clock=clock)
    write_phase(tmp_path, "trainer-0", "step 2 train", 10.0)
    write_phase(tmp_path, "trainer-1", "step 2 train", 5.0)
    clock.now = 105.0
    assert watch.overdue(watch.ages()) is None  # 100 s is not past 100
    clock.now = 140.0
    late = watch.overdue(watch.ages())
    assert (late.name, late.phase, late.seconds) == ("trainer-1", "step 2 train", 135.0)


def test_each_phase_is_noticed_once_past_half_the_timeout(tmp_path):
    clock = Clock(0.0)
    watch = PhaseWatch(tmp_path, ["trainer-0"], timeout_s=100, clock=clock)
    write_phase(tmp_path, "trainer-0", "step 1 rollout", 10.0)
    clock.now = 55.0
    assert watch.to_notice(watch.ages()) == []
    clock.now = 61.0
    assert [a.phase for a in watch.to_notice(watch.ages())] == ["step 1 rollout"]
    clock.now = 90.0
    assert watch.to_notice(watch.ages()) == []
    write_phase(tmp_path, "trainer-0", "step 1 train", 91.0)
    clock.now = 150.0
    assert [a.phase for a in watch.to_notice(watch.ages())] == ["step 1 train"]


def test_checks_are_spaced(tmp_path):
    clock = Clock(0.0)
    watch = PhaseWatch(tmp_path, ["trainer-0"], timeout_s=100, clock=clock)
    assert watch.due()
    clock.now = 0.5
    assert not watch.due()  # again within CHECK_EVERY_S
    clock.now = 1.0
    assert watch.due()


def test_any_phase_since_sees_a_rewritten_file_not_an_earlier_attempts(tmp_path):
    names = ["trainer-0", "trainer-1"]
    write_phase(tmp_path, "trainer-0", "step 9 eval", 500.0)  # a recovered run's first attempt
    stamps = phase_stamps(tmp_path, names)
    assert stamps["trainer-1"] is None and not any_phase_since(tmp_path, stamps)
    # the new attempt's first phase, its time behind this host's clock (a drifting file server)
    write_phase(tmp_path, "trainer-1", "step 1 rollout", 400.0)
    assert any_phase_since(tmp_path, stamps)
    stamps = phase_stamps(tmp_path, names)
    write_phase(tmp_path, "trainer-0", "step 9 eval", 501.0)  # same text, written again
    assert any_phase_since(tmp_path, stamps)
