"""scripts/summarise_run.py and scripts/demo_seeds.py: the figures they take from metrics.jsonl."""

import json

import pytest

from tests.scripts import load_script

summarise_run = load_script("summarise_run")
demo_seeds = load_script("demo_seeds")


def write_metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def step_row(step, step_s, **extra):
    return {
        "step": step,
        "rollout/n_samples": 8,
        "timing/step_s": step_s,
        "timing/train_s": step_s / 2,
        "rollout/reward_mean": 0.1 * step,
        "rollout/staleness_max": 1,
        **extra,
    }


def test_summarise_run_leaves_out_warmup_and_compares_to_the_first(tmp_path):
    sync = write_metrics(
        tmp_path / "sync.jsonl",
        [
            {"step": 0, "eval/accuracy": 0.1},
            step_row(1, 100.0),  # warmup: left out
            step_row(2, 2.0, **{"handoff/release_s": 0.2, "memory/server_train_peak_gb": 1.0}),
            step_row(3, 2.0, **{"handoff/release_s": 0.4, "memory/server_train_peak_gb": 3.0, "eval/accuracy": 0.5}),
        ],
    )
    fast = write_metrics(tmp_path / "async.jsonl", [step_row(1, 100.0), step_row(2, 1.0), step_row(3, 1.0)])
    out = tmp_path / "s.json"
    summarise_run.main([str(sync), str(fast), "--warmup", "1", "--out", str(out)])
    first, second = json.loads(out.read_text())
    assert first["steps"] == 2 and first["samples_per_s"] == 4.0 and first["step_s"] == 2.0
    assert first["phases_s"]["timing/train_s"] == 1.0
    assert first["handoff_s"] == {"handoff/release_s": 0.3}
    assert first["memory_gb_max"] == {"memory/server_train_peak_gb": 3.0}
    assert first["last_eval_accuracy"] == 0.5
    assert second["samples_per_s"] == 8.0 and second["speedup_vs_first"] == 2.0
    assert first["train_us_per_token"] is None and "train_us_per_token_vs_first" not in second  # no token counts
    assert first["recompute_others_cpu_share"] is None  # no cpu/ figures logged


def test_summarise_run_gives_the_pipelines_rate_without_evaluation_and_saves(tmp_path):
    # the last step evaluates and saves: 3 s of its 4, which the pipeline's rate leaves out
    sync = write_metrics(
        tmp_path / "sync.jsonl",
        [step_row(1, 2.0), step_row(2, 4.0, **{"timing/eval_s": 2.5, "timing/save_s": 0.5})],
    )
    fast = write_metrics(
        tmp_path / "async.jsonl",
        [step_row(1, 0.5), step_row(2, 3.5, **{"timing/eval_s": 2.5, "timing/save_s": 0.5})],
    )
    out = tmp_path / "s.json"
    summarise_run.main([str(sync), str(fast), "--warmup", "0", "--out", str(out)])
    first, second = json.loads(out.read_text())
    assert first["samples_per_s"] == round(16 / 6, 3) and first["pipeline_samples_per_s"] == round(16 / 3, 3)
    assert second["pipeline_samples_per_s"] == 16.0 and second["pipeline_speedup_vs_first"] == 3.0
    assert second["speedup_vs_first"] == 1.5


def test_summarise_run_gives_the_rollout_clients_cpu_share_during_recompute(tmp_path):
    cpu = {"cpu/recompute_logprob_main_s": 0.8, "cpu/recompute_logprob_others_s": 0.2}
    path = write_metrics(tmp_path / "m.jsonl", [step_row(1, 9.0), step_row(2, 1.0, **cpu), step_row(3, 1.0, **cpu)])
    assert summarise_run.summarise(path, 1)["recompute_others_cpu_share"] == 0.25


def test_summarise_run_gives_per_token_times_against_the_first(tmp_path):
    def row(step, tokens, train_s, recompute_s):
        return step_row(
            step,
            4.0,
            **{"train/n_tokens": tokens, "timing/train_s": train_s, "timing/recompute_logprob_s": recompute_s},
        )

    rlvr = write_metrics(
        tmp_path / "rlvr.jsonl", [row(1, 1000, 9.0, 9.0), row(2, 1000, 1.0, 0.25), row(3, 3000, 3.0, 0.75)]
    )
    agent = write_metrics(
        tmp_path / "agent.jsonl", [row(1, 10, 9.0, 9.0), row(2, 2000, 2.4, 0.4), row(3, 2000, 2.4, 0.4)]
    )
    out = tmp_path / "s.json"
    summarise_run.main([str(rlvr), str(agent), "--warmup", "1", "--out", str(out)])
    first, second = json.loads(out.read_text())
    assert first["train_us_per_token"] == 1000.0 and first["recompute_us_per_token"] == 250.0
    assert first["trained_tokens_per_s"] == 500.0  # 4000 tokens over 2 steps of 4 s
    assert second["train_us_per_token"] == 1200.0 and second["train_us_per_token_vs_first"] == 1.2
    assert second["recompute_us_per_token"] == 200.0 and second["recompute_us_per_token_vs_first"] == 0.8


def test_summarise_run_counts_the_steps_tokens_where_the_run_logged_them(tmp_path):
    """rollout/tokens (the batch's prompt and generated tokens) when a run has it; older runs' only
    count, train/n_tokens, is used otherwise."""
    rows = [step_row(s, 4.0, **{"train/n_tokens": 500, "rollout/tokens": 1000, "timing/train_s": 2.0}) for s in (1, 2)]
    path = write_metrics(tmp_path / "m.jsonl", rows)
    got = summarise_run.summarise(path, 0)
    assert got["trained_tokens_per_s"] == 250.0 and got["train_us_per_token"] == 2000.0
    old = write_metrics(tmp_path / "old.jsonl", [{k: v for k, v in r.items() if k != "rollout/tokens"} for r in rows])
    assert summarise_run.summarise(old, 0)["trained_tokens_per_s"] == 125.0


def test_summarise_run_gives_the_learning_figures_and_a_table(tmp_path, capsys):
    """First and last held-out accuracy, the mean of the last 3 evaluations (warm-up steps count:
    learning is judged over the whole run) and the training reward of the last 5 steps."""
    rows = [{"step": 0, "eval/accuracy": 0.2}]
    for step in range(1, 9):
        extra = {"eval/accuracy": 0.1 * step} if step % 2 == 0 else {}
        rows.append(step_row(step, 1.0, **extra))  # reward 0.1 * step
    run_dir = tmp_path / "abort_s1"
    run_dir.mkdir()
    path = write_metrics(run_dir / "metrics.jsonl", rows)
    got = summarise_run.summarise(path, 2)
    assert got["first_eval_accuracy"] == 0.2 and got["last_eval_accuracy"] == 0.8
    assert got["eval_last3_mean"] == pytest.approx(0.6)  # steps 4, 6, 8
    assert got["reward_last5_mean"] == pytest.approx(0.6)  # steps 4..8
    assert got["last_step"] == 8
    summarise_run.main([str(path), "--warmup", "2", "--table"])
    header, rule, row = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("| run | last step |") and rule.startswith("| ---")
    assert row == "| abort_s1 | 8 | 0.200 -> 0.800 | 0.600 | 0.600 | 8.0 | - |"  # no eval/n: no standard error


def test_summarise_run_counts_the_updates_that_met_requests(tmp_path):
    """weight_update/requests_in_flight above 0: the pause mode acted on that update."""
    rows = [step_row(s, 1.0, **{"weight_update/requests_in_flight": n}) for s, n in ((1, 0), (2, 12), (3, 0), (4, 3))]
    got = summarise_run.summarise(write_metrics(tmp_path / "m.jsonl", rows), 0)
    assert got["updates_with_requests"] == [2, 4]
    assert summarise_run.table([got]).splitlines()[-1].endswith("| 8.0 | 2 of 4 |")


def test_summarise_run_gives_the_staleness_bounds_seconds_per_step(tmp_path):
    """rollout/bound_idle_s: the servers idled for want of a newer version (the bound's cost)."""
    bound = ((0.5, 0.2), (0.3, 0.0), (0.4, 0.1))
    rows = [
        step_row(s, 1.0, **{"rollout/bound_held_s": h, "rollout/bound_idle_s": i}) for s, (h, i) in enumerate(bound, 1)
    ]
    got = summarise_run.summarise(write_metrics(tmp_path / "m.jsonl", rows), 1)
    assert got["bound_s"] == {"rollout/bound_held_s": 0.35, "rollout/bound_idle_s": 0.05}
    assert summarise_run.summarise(write_metrics(tmp_path / "old.jsonl", [step_row(1, 1.0)]), 0)["bound_s"] == {}


def test_summarise_run_gives_the_last_evaluations_standard_error(tmp_path):
    rows = [
        {"step": 0, "eval/accuracy": 0.2, "eval/n": 200},
        step_row(1, 1.0, **{"eval/accuracy": 0.75, "eval/n": 200}),
    ]
    got = summarise_run.summarise(write_metrics(tmp_path / "old.jsonl", rows), 0)
    assert got["last_eval_accuracy_se"] == pytest.approx(0.0306, abs=1e-4)  # from eval/n, for runs before the metric
    rows[-1]["eval/accuracy_se"] = 0.0194  # logged by the trainer: taken as it is
    got = summarise_run.summarise(write_metrics(tmp_path / "new.jsonl", rows), 0)
    assert got["last_eval_accuracy_se"] == 0.0194
    assert "0.200 -> 0.750 ± 0.019 |" in summarise_run.table([got])


def test_summarise_run_names_a_run_with_no_steps_after_warmup(tmp_path):
    path = write_metrics(tmp_path / "m.jsonl", [step_row(1, 1.0)])
    with pytest.raises(SystemExit, match="--warmup 2"):
        summarise_run.summarise(path, 2)


def test_demo_seeds_summary_and_report(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.0}] + [step_row(s, 0.5) for s in range(1, 21)]
    rows[10]["eval/accuracy"] = 0.95
    rows[20]["eval/accuracy"] = 0.92
    summary = demo_seeds.summarise(write_metrics(tmp_path / "metrics.jsonl", rows).parent)
    assert summary["accuracy"] == 0.92 and summary["best_accuracy"] == 0.95 and summary["steps"] == 20
    assert summary["train_s"] == 10.0  # 20 steps of 0.5 s: the loop alone, setup excluded
    assert summary["reward_first10"] == pytest.approx(0.55) and summary["reward_last10"] == pytest.approx(1.55)
    assert demo_seeds.summarise(tmp_path / "missing")["accuracy"] is None

    args = demo_seeds.parse_args(["--seeds", "3", "--goal", "0.9", "--", "algo=dapo"])
    assert args.seed_list == [1, 2, 3] and args.overrides == ["algo=dapo"]
    runs = [
        {"seed": s, "returncode": 0, "wall_s": w, "accuracy": a, "train_s": w - 20}
        for s, w, a in [(1, 200.0, 0.95), (2, 250.0, 0.85), (3, 220.0, None)]
    ]
    report = demo_seeds.report(runs, args)
    assert report["accuracy"] == {"min": 0.85, "median": pytest.approx(0.9), "max": 0.95}
    assert report["wall_s"]["median"] == 220.0 and report["train_s"] == {"min": 180.0, "median": 200.0, "max": 230.0}
    assert report["reached_goal"] == "1/3 at >= 0.9"  # a run with no evaluation did not reach it


def test_summaries_count_a_step_logged_twice_once_with_its_last_record(tmp_path):
    """metrics.jsonl is appended to: a run started again in its directory logs steps 1.. again."""
    first = [{"step": 0, "eval/accuracy": 0.1}, step_row(1, 9.0), step_row(2, 50.0, **{"eval/accuracy": 0.2})]
    again = [{"step": 0, "eval/accuracy": 0.3}, step_row(1, 9.0), step_row(2, 2.0, **{"eval/accuracy": 0.6})]
    path = write_metrics(tmp_path / "metrics.jsonl", first + again)
    summary = summarise_run.summarise(path, 1)
    assert summary["steps"] == 1 and summary["step_s"] == 2.0
    assert summary["first_eval_accuracy"] == 0.3 and summary["last_eval_accuracy"] == 0.6
    assert demo_seeds.summarise(tmp_path)["eval_curve"] == {0: 0.3, 2: 0.6}
