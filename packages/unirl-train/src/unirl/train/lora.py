"""LoRA through peft: injection into named modules, enable/disable, adapter and merged weights.

`inject_lora` mutates the module in place (peft `inject_adapter_in_model`), so the model keeps
its class and call signature and pipelines need no change. peft freezes every base weight; only
the `lora_A` / `lora_B` weights stay trainable. The weight-sync helpers work on *full* state
dicts (what `get_model_state_dict(full_state_dict=True)` returns under FSDP2), so they serve a
sharded model as well as a plain one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

ADAPTER = "default"
_LORA_KEY = re.compile(r"^(?P<prefix>.*)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


class LoRAConfig(BaseModel):
    """Low-rank adapters on the modules whose names match `target_modules`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    r: int = Field(ge=1, description="Rank.")
    alpha: float = Field(gt=0, description="Scale numerator: the update is (alpha / r) * B @ A.")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        min_length=1,
        description="Module-name suffixes (peft semantics), e.g. ['to_q', 'to_k', 'to_v', 'to_out.0'] "
        "for diffusers attention or ['q_proj', 'k_proj', 'v_proj', 'o_proj'] for transformers.",
    )
    init_lora_weights: bool | str = Field(default=True, description="peft init (True: B = 0).")


def inject_lora(module: torch.nn.Module, config: LoRAConfig) -> torch.nn.Module:
    """Inject LoRA layers in place; raises ValueError when no module matches the targets."""
    from peft import LoraConfig, inject_adapter_in_model

    peft_config = LoraConfig(
        r=config.r,
        lora_alpha=config.alpha,  # type: ignore[arg-type]  # peft annotates int; alpha / r is float math
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        init_lora_weights=config.init_lora_weights,  # type: ignore[arg-type]  # peft validates the name
    )
    try:
        module = inject_adapter_in_model(peft_config, module, adapter_name=ADAPTER)
    except ValueError as e:
        raise ValueError(
            f"lora.target_modules={config.target_modules} matched no module of {type(module).__name__}: {e}"
        ) from e
    if not lora_layers(module):
        raise ValueError(f"lora.target_modules={config.target_modules} matched no module")
    return module


def lora_layers(module: torch.nn.Module) -> dict[str, Any]:
    """The peft tuner layers of `module`, by qualified name."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n: m for n, m in module.named_modules() if isinstance(m, BaseTunerLayer)}


def has_lora(module: torch.nn.Module) -> bool:
    """Whether `module` carries injected LoRA layers."""
    return bool(lora_layers(module))


@contextmanager
def lora_disabled(module: torch.nn.Module) -> Iterator[None]:
    """Run the body on the base model (adapters bypassed): the reference policy for KL.

    peft's `enable_adapters(True)` marks the active adapters trainable again on exit.
    """
    layers = list(lora_layers(module).values())
    if not layers:
        raise ValueError("lora_disabled needs a module with injected LoRA layers (set lora in the config)")
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def lora_scalings(module: torch.nn.Module) -> dict[str, float]:
    """scaling (alpha / r) of each LoRA layer, by qualified module name."""
    return {n: float(m.scaling[ADAPTER]) for n, m in lora_layers(module).items()}


def adapter_state_dict(full_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA weights of a full state dict, in peft's file layout (`...lora_A.weight`)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in full_state.items():
        m = _LORA_KEY.match(key)
        if m and m["adapter"] == ADAPTER:
            out[f"{m['prefix']}.lora_{m['ab']}.weight"] = value
    return out


@torch.no_grad()
def merge_lora_state_dict(
    full_state: Mapping[str, torch.Tensor], scalings: Mapping[str, float]
) -> dict[str, torch.Tensor]:
    """Base-model weights with the LoRA updates folded in, under the base model's key names.

    For each LoRA linear `prefix`: W = base_layer.weight + scaling * B @ A (computed in fp32,
    cast back), key `prefix.weight`; `prefix.base_layer.bias` becomes `prefix.bias`. LoRA keys
    are dropped. Only linear (2-D) LoRA layers are supported.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in full_state.items():
        if _LORA_KEY.match(key):
            continue
        out[key.replace(".base_layer.", ".")] = value
    for prefix, scale in scalings.items():
        a = full_state[f"{prefix}.lora_A.{ADAPTER}.weight"]
        b = full_state[f"{prefix}.lora_B.{ADAPTER}.weight"]
        base = full_state[f"{prefix}.base_layer.weight"]
        if base.dim() != 2:
            raise ValueError(
                f"merge_lora_state_dict supports linear LoRA layers only; {prefix} is {base.dim()}-D"
            )
        out[f"{prefix}.weight"] = (base.float() + scale * (b.float() @ a.float())).to(base.dtype)
    return out
