"""`workflow.type` to a RolloutWorkflow: built-in names or an import path.

    workflow:
      type: rlvr                          # or multi_turn, agent, or my_pkg.flows:MyWorkflow
      kwargs: {feedback: "Try again."}    # extra constructor arguments

A class with a `from_config(cfg, tokenizer, **kwargs)` classmethod is built from the experiment
config (the built-ins are); any other class is called as `cls(**workflow.kwargs)`.
"""

from __future__ import annotations

from areal.api.workflow import RolloutWorkflow

BUILTIN_WORKFLOWS = {
    "rlvr": "areal.workflow.rlvr:RLVRWorkflow",
    "multi_turn": "areal.workflow.multi_turn:MultiTurnWorkflow",
    "agent": "areal.workflow.agent:AgentWorkflow",
}


def resolve_workflow_class(spec: str) -> type:
    """The class named by a built-in name or 'package.module:Class', checked to be a workflow."""
    from areal.reward.registry import import_object

    if spec in BUILTIN_WORKFLOWS:
        spec = BUILTIN_WORKFLOWS[spec]
    elif ":" not in spec:
        raise ValueError(
            f"workflow.type={spec!r} is not a built-in workflow "
            f"({', '.join(BUILTIN_WORKFLOWS)}) nor an import path 'package.module:Class'"
        )
    cls = import_object(spec, kind="workflow")
    if not (isinstance(cls, type) and issubclass(cls, RolloutWorkflow)):
        raise TypeError(f"workflow.type={spec!r} is {cls!r}, not a subclass of areal.api.workflow.RolloutWorkflow")
    return cls


def build_workflow(cfg, tokenizer) -> RolloutWorkflow:
    """The workflow of an ExperimentConfig; `tokenizer` is a tokenizer or its path. With
    workflow.workers > 0 its episodes run in that many worker processes, each building the same
    workflow with workflow.workers=0 (areal/workflow/in_workers.py)."""
    cls = resolve_workflow_class(cfg.workflow.type)
    if cfg.workflow.workers and cfg.workflow.type != "agent":
        return _in_workers(cfg, tokenizer, cls.__name__)
    kwargs = dict(cfg.workflow.kwargs)
    if hasattr(cls, "from_config"):
        return cls.from_config(cfg, tokenizer, **kwargs)
    return cls(**kwargs)


def _in_workers(cfg, tokenizer, inner_name: str) -> RolloutWorkflow:
    import functools

    from areal.infra.sockets import rollout_client_open_files
    from areal.workflow.in_workers import WorkflowInWorkers

    local = cfg.model_copy(deep=True)
    local.workflow.workers = 0
    open_files, keys = rollout_client_open_files(cfg)
    return WorkflowInWorkers(
        functools.partial(build_workflow, local, tokenizer),
        cfg.workflow.workers,
        inner_name=inner_name,
        open_files=open_files,
        open_files_keys=keys,
        unpicklable_hint="pass the tokenizer as a path and the reward as a name or import path",
    )
