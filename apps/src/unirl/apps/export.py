"""`unirl export RUN_DIR`: the trained policy of a run as a checkpoint its family's library loads.

The run's model is rebuilt from its resolved ``config.yaml`` exactly as the trainer built it (same
seed, same loader, the backend's LoRA injection), the last complete checkpoint is loaded into the
backend, and the backend's full weights are written back into a clean instance of the family's
own class:

- ``--format diffusers`` (diffusion runs): the whole pipeline folder (``model_index.json``, the
  trained transformer, the frozen VAE / text encoders / tokenizers / scheduler as the run used
  them), loadable with ``<Family>Pipeline.from_pretrained(out)``.
- ``--format hf`` (AR runs): the causal LM and its tokenizer, loadable with
  ``AutoModelForCausalLM.from_pretrained(out)`` / ``AutoTokenizer.from_pretrained(out)``.

A LoRA run is exported with the adapter folded in (``--merge-lora``) or unmerged: the base model
as above plus ``out/lora/`` in peft's format (``adapter_config.json`` + ``adapter_model.safetensors``,
``PeftModel.from_pretrained(base_module, out / "lora")``). ``--ema`` exports the EMA weights.
``out/unirl_export.json`` records where the weights came from.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from unirl.apps.config import RecipeError, validate
from unirl.apps.trainers.ar_config import Recipe as ARRecipe
from unirl.apps.trainers.diffusion_config import Recipe as DiffusionRecipe
from unirl.rollout.ar import CausalLMBundle
from unirl.rollout.models.base import DiffusersPipelineBundle
from unirl.train.lora import LoRAConfig

__all__ = ["export_run"]

FORMATS = {"diffusion": "diffusers", "ar": "hf"}
"""Trainer kind -> the export format its models have."""


def recipe_class(kind: str) -> type[ARRecipe] | type[DiffusionRecipe]:
    """The Recipe model of an exportable trainer kind (a key of ``FORMATS``)."""
    return DiffusionRecipe if kind == "diffusion" else ARRecipe


def export_run(
    run_dir: str | Path,
    fmt: Literal["hf", "diffusers"],
    *,
    out: str | Path | None = None,
    merge_lora: bool = False,
    ema: bool = False,
) -> Path:
    """Export ``run_dir``'s last checkpoint; returns the output folder (default ``RUN_DIR/export-<fmt>``)."""
    from unirl.train.checkpoint import load_checkpoint

    root = Path(run_dir)
    _, recipe, ckpt = _exportable_run(root, fmt)
    lora = recipe.backend.lora
    if merge_lora and lora is None:
        raise RecipeError(
            "--merge-lora: this run trained full weights (backend.lora is not set); drop the flag"
        )

    torch.manual_seed(recipe.seed)  # the trainer's global seed before it builds the model
    cpu = torch.device("cpu")
    lm: CausalLMBundle | None = None  # an AR run's bundle (its tokenizer is exported too)
    if isinstance(recipe, DiffusionRecipe):
        bundle = recipe.model.build(cpu, recipe.seed)
        if not isinstance(bundle, DiffusersPipelineBundle):
            raise RecipeError(
                f"model.kind={recipe.model.kind!r} is not a diffusers pipeline, so it has no diffusers "
                "format; export supports the sd3 / flux / qwen_image / flux2_klein / z_image kinds"
            )
        pipe, module = bundle.pipe, bundle.transformer
    else:
        lm = recipe.model.model_copy(update={"device": "cpu"}).build()
        pipe, module = None, lm.model
    cls, config = type(module), module.config  # before the backend wraps the module in place
    backend = recipe.backend.build(module, device=cpu)
    load_checkpoint(ckpt, backend)
    with backend.ema_weights() if ema else nullcontext():
        state = backend.full_state_dict(merge_lora=lora is None or merge_lora)
        adapter = backend.lora_state_dict() if lora is not None and not merge_lora else None
    if adapter is not None:  # full_state_dict kept the LoRA keys: the base weights are the rest
        from unirl.train.lora import merge_lora_state_dict

        state = merge_lora_state_dict(state, {})
    clean = _fresh(cls, config, state)

    dest = Path(out) if out is not None else root / f"export-{fmt}"
    if lm is None:  # diffusion: the whole pipeline folder
        pipe.register_modules(transformer=clean)
        pipe.save_pretrained(dest)
    else:
        clean.save_pretrained(dest)
        lm.tokenizer.save_pretrained(dest)
    if adapter is not None and lora is not None:
        _save_peft_adapter(adapter, lora, dest / "lora")
    meta = {
        "run_dir": str(root.resolve()),
        "checkpoint": str(ckpt),
        "global_step": backend.global_step,
        "format": fmt,
        "model_kind": recipe.model.kind,
        "class": cls.__name__,
        "lora": None if lora is None else ("merged" if merge_lora else "lora/ (peft)"),
        "ema": ema,
    }
    (dest / "unirl_export.json").write_text(json.dumps(meta, indent=2) + "\n")
    return dest


def _exportable_run(root: Path, fmt: str) -> tuple[str, ARRecipe | DiffusionRecipe, Path]:
    """``(trainer kind, validated recipe, last complete checkpoint)`` of the run at ``root``, or a
    RecipeError when it is no run, its trainer cannot export as ``fmt``, or it has no checkpoint."""
    from unirl.apps.loop import latest_checkpoint

    cfg_path = root / "config.yaml"
    if not cfg_path.is_file():
        raise RecipeError(f"{root} has no config.yaml: not a unirl run directory (unirl train writes one)")
    data = yaml.safe_load(cfg_path.read_text())
    kind = data.get("trainer")
    if kind not in FORMATS:
        raise RecipeError(
            f"export supports trainer: {' / '.join(FORMATS)} runs; {cfg_path} has trainer={kind!r}"
        )
    if fmt != FORMATS[kind]:
        raise RecipeError(f"a {kind} run exports as --format {FORMATS[kind]}, not --format {fmt}")
    recipe = validate(recipe_class(kind), data, source=str(cfg_path))
    ckpt = latest_checkpoint(root)
    if ckpt is None:
        raise RecipeError(f"{root}/checkpoints has no complete checkpoint to export; train the run first")
    return kind, recipe, ckpt


def _fresh(cls: type, config: object, state: dict[str, torch.Tensor]) -> Any:
    """A clean instance of the family's class (no FSDP / peft wrapping) holding ``state``: a
    diffusers ModelMixin or a transformers PreTrainedModel (untyped: neither library is typed here)."""
    if hasattr(cls, "from_config"):  # diffusers models (a classmethod transformers models lack)
        model = cls.from_config(config)
    else:  # transformers models
        model = cls(config)
    dtype = next(iter(state.values())).dtype if state else torch.float32
    if next(model.parameters()).dtype != dtype:
        model.to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])  # transformers' tied weights, if any
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(
            f"the checkpoint does not fill {cls.__name__}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    model.eval()
    return model


def _save_peft_adapter(adapter: dict[str, torch.Tensor], lora: LoRAConfig, dest: Path) -> None:
    """``adapter`` (``prefix.lora_A.weight`` keys) as a peft adapter folder."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft annotates int; alpha / r is float math
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
    ).save_pretrained(str(dest))
    tensors = {f"base_model.model.{k}": v.contiguous() for k, v in adapter.items()}
    save_file(tensors, str(dest / "adapter_model.safetensors"))
