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
    """The workflow of an ExperimentConfig; `tokenizer` is a tokenizer or its path."""
    cls = resolve_workflow_class(cfg.workflow.type)
    kwargs = dict(cfg.workflow.kwargs)
    if hasattr(cls, "from_config"):
        return cls.from_config(cfg, tokenizer, **kwargs)
    return cls(**kwargs)
