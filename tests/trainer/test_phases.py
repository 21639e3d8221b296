"""Phases: wall seconds per phase, and the CPU seconds of the training thread and of the others."""

import threading
import time

from areal.trainer.grpo import Phases


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_of_other_threads_is_told_apart_from_the_training_thread():
    phases = Phases()
    with phases("train"):
        worker = threading.Thread(target=_burn, args=(0.3,))
        worker.start()
        worker.join()  # the main thread sleeps in join: its own CPU stays near zero
    with phases("recompute_logprob"):
        _burn(0.2)
    m = phases.metrics()
    assert m["timing/train_s"] >= 0.3
    assert m["cpu/train_others_s"] >= 0.25
    assert m["cpu/train_main_s"] < 0.1
    assert m["cpu/recompute_logprob_main_s"] >= 0.2
    assert m["cpu/recompute_logprob_others_s"] < 0.1


def test_a_phase_entered_twice_accumulates():
    phases = Phases()
    for _ in range(2):
        with phases("train"):
            _burn(0.05)
    m = phases.metrics()
    assert m["cpu/train_main_s"] >= 0.1
    assert m["timing/train_s"] >= 0.1
