"""LoRA adapters on the built-in server: SGLang's /load_lora_adapter and /unload_lora_adapter.

SGLang keeps adapters beside the base weights and applies one per request (the request's
`lora_path` names it; a request without one gets the base model). This server runs one set of
weights, so it serves one adapter at a time, merged into the weights:

* /load_lora_adapter {lora_name, lora_path} reads a peft folder (adapter_config.json +
  adapter_model.safetensors), sets W = W0 + scaling * B @ A for every targeted module
  (scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora) and makes that adapter the
  active one. W0 is a CPU copy of the base weights taken when the first adapter is loaded, so
  loads replace each other rather than add up. Earlier adapters stay listed as loaded (as in
  SGLang, where the trainer loads v{n+1} before it unloads v{n}) but are no longer served.
* /generate with `lora_path` naming the active adapter runs on the merged weights; naming any
  other adapter (unknown, unloaded, or loaded but no longer active) is a 400 that names the
  active one. Requests without `lora_path` also get the current weights, adapter included:
  unlike SGLang, the base model is not served while an adapter is active.
* /unload_lora_adapter {lora_name} forgets the adapter; unloading the active one restores W0.
* A full weight update (/update_weights_from_disk, /update_weights_from_distributed) replaces the
  base: adapters are dropped and the new weights are served as they are.

The operations run on the scheduler's worker thread between decode steps, like other weight
updates (after running requests finish, unless generation is paused).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

logger = logging.getLogger("areal.server")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."


class LoraAdapters:
    """The adapters of one server (mutated on the worker thread only)."""

    def __init__(self, runner):
        self.runner = runner
        self.loaded: dict[str, str] = {}  # name -> path, in load order
        self.active: str | None = None
        self._base: dict[str, object] = {}  # parameter name -> CPU copy of its base weight

    def check_request(self, lora_path: str) -> None:
        """Raise ValueError unless `lora_path` names the adapter being served."""
        if lora_path == self.active:
            return
        if lora_path in self.loaded:
            raise ValueError(
                f"LoRA adapter {lora_path!r} is loaded but no longer served: the "
                "built-in server serves one adapter at a time, the last loaded "
                f"({self.active!r}). Send lora_path {self.active!r}."
            )
        raise ValueError(
            f"LoRA adapter {lora_path!r} is not loaded; loaded adapters: "
            f"{list(self.loaded)} (serving {self.active!r}). Load it with "
            "/load_lora_adapter first."
        )

    def load(self, name: str, path: str) -> str:
        import torch

        if name in self.loaded:
            raise ValueError(
                f"LoRA adapter {name!r} is already loaded (from "
                f"{self.loaded[name]!r}); unload it first or pick another name."
            )
        deltas = self._read(path)
        params = dict(self.runner.model.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for pname in deltas:
                if pname not in self._base:
                    self._base[pname] = params[pname].detach().to("cpu", copy=True)
            for pname, base in self._base.items():
                target = params[pname]
                merged = base.float() + deltas[pname] if pname in deltas else base
                target.copy_(merged.to(device=target.device, dtype=target.dtype))
        self.loaded[name] = path
        self.active = name
        logger.info("LoRA adapter %r loaded from %s (%d modules)", name, path, len(deltas))
        return f"Succeeded to load LoRA adapter {name!r} from {path} ({len(deltas)} modules merged)."

    def unload(self, name: str) -> str:
        if name not in self.loaded:
            raise ValueError(f"LoRA adapter {name!r} is not loaded; loaded adapters: {list(self.loaded)}.")
        del self.loaded[name]
        if name == self.active:
            self._restore_base()
            self.active = None
        return f"Succeeded to unload LoRA adapter {name!r}."

    def reset(self) -> None:
        """After a full weight update: the new weights are the base; adapters are dropped."""
        if self.loaded:
            logger.info("full weight update: LoRA adapters %s dropped", list(self.loaded))
        self.loaded.clear()
        self.active = None
        self._base.clear()

    def _restore_base(self) -> None:
        import torch

        params = dict(self.runner.model.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for pname, base in self._base.items():
                params[pname].copy_(base.to(device=params[pname].device, dtype=params[pname].dtype))
        self._base.clear()

    def _read(self, path: str) -> dict:
        """Parameter name -> float32 CPU delta (scaling * B @ A); every check happens here,
        before anything is changed."""
        from safetensors.torch import load_file

        folder = Path(path)
        try:
            cfg = json.loads((folder / CONFIG_FILE).read_text())
            tensors = load_file(str(folder / WEIGHTS_FILE))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"Cannot read a peft LoRA adapter from {path!r} (needs {CONFIG_FILE} and {WEIGHTS_FILE}): {exc}"
            ) from None
        unsupported = [k for k in ("use_dora", "fan_in_fan_out") if cfg.get(k)]
        unsupported += [k for k in ("rank_pattern", "alpha_pattern", "modules_to_save") if cfg.get(k)]
        if unsupported:
            raise ValueError(f"LoRA adapter {path!r}: {unsupported} are not supported by the built-in server.")
        r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        params = dict(self.runner.model.named_parameters(remove_duplicate=False))
        pairs: dict[str, dict] = {}
        for key, tensor in tensors.items():
            name = key.removeprefix(_PEFT_PREFIX)
            for part in ("lora_A", "lora_B"):
                suffix = f".{part}.weight"
                if name.endswith(suffix):
                    pairs.setdefault(name[: -len(suffix)], {})[part] = tensor
                    break
            else:
                raise ValueError(f"LoRA adapter {path!r}: tensor {key!r} is not a lora_A/lora_B weight.")
        deltas = {}
        for module, ab in pairs.items():
            pname = module + ".weight"
            if pname not in params or set(ab) != {"lora_A", "lora_B"}:
                raise ValueError(
                    f"LoRA adapter {path!r}: module {module!r} is not a module of the "
                    "served model, or lacks lora_A or lora_B."
                )
            delta = scaling * (ab["lora_B"].float() @ ab["lora_A"].float())
            if tuple(delta.shape) != tuple(params[pname].shape):
                raise ValueError(
                    f"LoRA adapter {path!r}: module {module!r} gives a "
                    f"{list(delta.shape)} update for a {list(params[pname].shape)} weight."
                )
            deltas[pname] = delta
        if not deltas:
            raise ValueError(f"LoRA adapter {path!r} has no lora_A/lora_B tensors.")
        return deltas
