"""`areal-launch`: compose -> validate -> plan -> launch.

    areal-launch --config gsm8k_grpo.yaml [hydra overrides...] [--dry-run [--json]] [--cfg job|all [--resolve]]

Exit codes: 0 success, 2 config error (printed before anything starts), otherwise the exit code
of the first process that failed.
"""

from __future__ import annotations

import argparse
import sys

from areal.config import ConfigError, ExperimentConfig
from areal.infra import sglang_logging

EXIT_CONFIG = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="areal-launch",
        description="Compose a YAML experiment with Hydra, validate it, plan and launch it.",
        epilog="Overrides use Hydra's grammar: a.b=v, +a.b=v, ~a.b, a.b=null, a.l=[1,2], group=option.",
    )
    p.add_argument(
        "--config", required=True, help="a config name under configs/ (e.g. gsm8k_grpo) or a path to a YAML file"
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides")
    p.add_argument("--dry-run", action="store_true", help="print the launch plan and start nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    p.add_argument(
        "--cfg",
        choices=["job", "all"],
        help="print the config and exit: 'job' as composed, 'all' validated with every default filled",
    )
    p.add_argument("--resolve", action="store_true", help="with --cfg job: resolve ${...} interpolations")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError as e:
        print(e.format(), file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


def _run(args) -> int:
    from .compose import compose

    if args.cfg == "job":
        print(_yaml(compose(args.config, args.overrides, resolve=args.resolve)), end="")
        return 0
    from areal.config import validate_config

    cfg = validate_config(compose(args.config, args.overrides))
    if args.cfg == "all":
        print(_yaml(cfg.model_dump()), end="")
        return 0
    from areal.infra.host import detect_host_facts

    from .plan import make_plan

    facts = detect_host_facts()
    plan = make_plan(cfg, facts)
    if args.dry_run:
        print(plan.to_json() if args.json else plan.describe())
        return 0
    from .preflight import preflight

    issues = preflight(cfg, facts)
    if issues:
        raise ConfigError(issues)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    write_run_dir(cfg, plan)
    return _backend(cfg.launcher.backend)(plan, cfg)


def write_run_dir(cfg: ExperimentConfig, plan) -> None:
    """config.yaml (resolved, validated) and plan.json: what every process reads and what ran.
    config.yaml names the server program, pause mode and stream interval the plan resolved, so no process has
    to find them out again, and where trainers start with the servers, a rollout.setup_timeout_s
    of at least launcher.server_startup_timeout_s."""
    from pathlib import Path

    run_dir = Path(cfg.run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    data = cfg.model_dump()
    if plan.server_kind:
        data["rollout"]["server"] = plan.server_kind
    if plan.pause_mode:
        data["rollout"]["pause_mode"] = plan.pause_mode
        data["rollout"]["stream_interval"] = plan.stream_interval
    if plan.mains_start_with_servers:  # their client waits for /health as long as the launcher does
        startup = cfg.launcher.server_startup_timeout_s
        data["rollout"]["setup_timeout_s"] = max(cfg.rollout.setup_timeout_s, startup)
    (run_dir / "config.yaml").write_text(_yaml(data))
    (run_dir / "plan.json").write_text(plan.to_json())
    if plan.server_kind == "sglang" and plan.by_role("server"):
        sglang_logging.write_logging_config(cfg.run_dir, cfg.sglang.log_level)


def _backend(name: str):
    if name == "ray":
        from .ray import run_ray

        return run_ray
    from .local import run_local

    return run_local


def _yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


if __name__ == "__main__":
    sys.exit(main())
