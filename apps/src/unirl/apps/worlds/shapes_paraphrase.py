"""The prompt-enhancer world: terse or noisy user prompts of the shapes grammar -> canonical captions.

A user writes ``"draw 2 rd sq"``; the shapes renderer was trained on ``"two red squares"`` and reads
words it does not know as UNK. The enhancer (a tiny LLM) learns to rewrite the one into the other:
first by SFT on (noisy, canonical) pairs, then by RL with the GenEval-style checker scoring the
render against the ORIGINAL prompt's meaning (its canonical caption, ``PromptRecord.answer``).

Every noisy form is a deterministic function of (spec, variant index), so the prompt set is fixed;
the split holds out whole user prompts (a seeded ``held_out_fraction`` of the noisy strings of every
spec): an evaluated prompt was never seen in SFT or RL, while its meaning may have been in another
wording. The renderer's own SFT (``sft_examples``) draws canonical captions of every spec: it is the
fixed instrument the enhancer writes for.
"""

from __future__ import annotations

import random
import re
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from unirl.apps.loop import PromptRecord
from unirl.apps.worlds.caption_noise import mislabel
from unirl.apps.worlds.shapes import ShapesWorld, ShapesWorldConfig
from unirl.reward.worlds.shapes_spec import ObjectGroup, ShapesSpec, spec_to_caption

COUNT_FORMS: dict[int, tuple[str, ...]] = {
    1: ("1", "one", "a", "single"),
    2: ("2", "two", "pair"),
    3: ("3", "three", "trio"),
}
COLOUR_FORMS: dict[str, tuple[str, ...]] = {
    "red": ("red", "rd", "r"),
    "green": ("green", "grn", "g"),
    "blue": ("blue", "blu", "b"),
}
SHAPE_FORMS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "circ", "dot"),
    "square": ("square", "sq", "box"),
}
RELATION_FORMS: dict[str, tuple[str, ...]] = {
    "left of": ("left of", "lft of", "left"),
    "right of": ("right of", "rgt of", "right"),
    "above": ("above", "over"),
    "below": ("below", "under"),
}
PREFIXES: tuple[str, ...] = ("", "draw ", "pic of ", "pls ")
_FORM_TABLES = (COUNT_FORMS, COLOUR_FORMS, SHAPE_FORMS, RELATION_FORMS)
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 ="
"""Every character a noisy prompt, a canonical caption or the prompt template ('{prompt}=') uses."""


def noisy_group(group: ObjectGroup, rng: random.Random) -> str:
    """One noisy phrase for a group: count, colour and shape in some order and some spelling."""
    n = rng.choice(COUNT_FORMS[group.count])
    col = rng.choice(COLOUR_FORMS[group.colour])
    shp = rng.choice(SHAPE_FORMS[group.shape])
    if group.count > 1 and rng.random() < 0.5:
        shp += "s"
    form = rng.randrange(3)
    if form == 0:
        return f"{n} {col} {shp}"
    if form == 1:
        return f"{col} {shp} x{group.count}"
    return f"{shp} {col} {n}"


def caption_words(count: int) -> set[str]:
    """The canonical words (count word, colours, shapes, relations) of captions with groups of ``count``."""
    spec = ShapesSpec(groups=[ObjectGroup(count=count, colour="red", shape="circle")])
    return {spec_to_caption(spec).split()[0]} | {
        w for table in (COLOUR_FORMS, SHAPE_FORMS, RELATION_FORMS) for w in table
    }


def uses_form(prompt: str, form: str) -> bool:
    """Whether ``prompt`` contains the user form ``form`` as a word (or its plural, ``form + 's'``)."""
    return re.search(rf"(?<![a-z0-9]){re.escape(form)}s?(?![a-z0-9])", prompt) is not None


def noisy_prompt(spec: ShapesSpec, variant: int, key: str = "pe-v1") -> str:
    """Noisy form ``variant`` of ``spec``: a pure function of (caption, variant, key)."""
    rng = random.Random(f"{key}/{spec_to_caption(spec)}/{variant}")
    head = noisy_group(spec.groups[0], rng)
    if spec.relation is not None:
        head = f"{head} {rng.choice(RELATION_FORMS[spec.relation])} {noisy_group(spec.groups[1], rng)}"
    return rng.choice(PREFIXES) + head


class ShapesParaphraseDataConfig(BaseModel):
    """The PE world: the shapes grammar (``ShapesWorldConfig``'s fields) with noisy user prompts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["shapes_paraphrase"] = "shapes_paraphrase"
    variants_per_spec: int = Field(
        default=12, ge=2, description="noisy prompts drawn per spec (duplicates dropped)"
    )
    held_out_fraction: float = Field(default=0.2, gt=0, lt=1, description="of each spec's noisy prompts")
    split_seed: int = Field(default=0, ge=0)
    resolution: int = Field(default=32, ge=8)
    size_min: int = Field(default=7, ge=1)
    size_max: int = Field(default=9, ge=1)
    gap: int = Field(default=2, ge=0)
    layout: Literal["free", "grid"] = "free"
    grid_cells: int = Field(default=4, ge=2)
    max_count_single: int = Field(default=3, ge=1, le=3)
    max_count_pair: int = Field(default=1, ge=1, le=2)
    include_pairs: bool = Field(default=False, description="relation captions too (a longer rewrite)")
    sft_unseen_forms: tuple[str, ...] = Field(
        default=(),
        description="user words (e.g. 'trio', 'box') no SFT rewrite pair contains: the SFT pairs skip "
        "every training prompt that uses one (as a word, plural included), while RL (reward only, no "
        "rewrite labels) and evaluation see every prompt; each must be a form of COUNT/COLOUR/SHAPE/"
        "RELATION_FORMS that is not the canonical word itself",
    )
    rl_prompts: Literal["all", "unlabelled"] = Field(
        default="all",
        description="the training prompts RL draws from: all, or unlabelled (only those using one of "
        "sft_unseen_forms: the prompts SFT had no rewrite for, where the reward is the only teacher)",
    )

    sft_rewrite_noise: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="fraction of SFT rewrite pairs whose target is the canonical caption of a random "
        "spec instead of the prompt's own (a noisy labeller); RL and evaluation never see it",
    )

    @field_validator("sft_unseen_forms")
    @classmethod
    def _known_forms(cls, forms: tuple[str, ...]) -> tuple[str, ...]:
        canonical = {w for c in COUNT_FORMS for w in caption_words(c)}
        allowed = {f for table in _FORM_TABLES for fs in table.values() for f in fs} - canonical
        bad = [f for f in forms if f not in allowed]
        if bad:
            raise ValueError(
                f"sft_unseen_forms={bad} are not non-canonical user forms; pick from {sorted(allowed)}"
            )
        return forms

    def build(self) -> ShapesParaphraseSource:
        world = ShapesWorld(
            ShapesWorldConfig(
                **self.model_dump(
                    exclude={
                        "kind",
                        "variants_per_spec",
                        "held_out_fraction",
                        "split_seed",
                        "sft_unseen_forms",
                        "rl_prompts",
                        "sft_rewrite_noise",
                    }
                ),
                split_seed=self.split_seed,
            )
        )
        return ShapesParaphraseSource(world, self)


class ShapesParaphraseSource:
    """Prompt records (noisy prompt, canonical caption as ``answer``) for the PE trainer, SFT pairs
    for the enhancer and (image, caption) renders for the renderer."""

    name = "shapes_paraphrase"

    def __init__(self, world: ShapesWorld, cfg: ShapesParaphraseDataConfig) -> None:
        self.world, self.cfg = world, cfg
        rng = random.Random(cfg.split_seed)
        self._captions = sorted({spec_to_caption(spec) for spec in world.specs("all")})
        self._split: dict[str, list[PromptRecord]] = {"train": [], "held_out": []}
        for spec in world.specs("all"):
            caption = spec_to_caption(spec)
            forms = list(dict.fromkeys(noisy_prompt(spec, v) for v in range(cfg.variants_per_spec)))
            rng.shuffle(forms)
            n_held = max(1, round(cfg.held_out_fraction * len(forms)))
            for split, chunk in (("held_out", forms[:n_held]), ("train", forms[n_held:])):
                self._split[split] += [
                    PromptRecord(id=f"{split[0]}{len(self._split[split]) + i}", prompt=p, answer=caption)
                    for i, p in enumerate(chunk)
                ]

    def train_records(self) -> list[PromptRecord]:
        """The prompts RL draws from (``rl_prompts``): every training prompt, or the unlabelled ones."""
        if self.cfg.rl_prompts == "all":
            return list(self._split["train"])
        unseen = self.cfg.sft_unseen_forms
        recs = [r for r in self._split["train"] if any(uses_form(r.prompt, f) for f in unseen)]
        if not recs:
            raise ValueError(
                f"data.rl_prompts=unlabelled with data.sft_unseen_forms={list(unseen)}: no training prompt "
                "is unlabelled; name forms in sft_unseen_forms or set rl_prompts: all"
            )
        return recs

    def all_records(self) -> list[PromptRecord]:
        """Every prompt of both splits (the world's vocabulary)."""
        return self._split["train"] + self._split["held_out"]

    def sft_records(self) -> list[PromptRecord]:
        """The training prompts with a rewrite label: those using none of ``sft_unseen_forms``."""
        unseen = self.cfg.sft_unseen_forms
        recs = [r for r in self._split["train"] if not any(uses_form(r.prompt, f) for f in unseen)]
        if not recs:
            raise ValueError(f"data.sft_unseen_forms={list(unseen)} leaves no SFT pair; name fewer forms")
        return recs

    def eval_records(self) -> list[PromptRecord]:
        """Held-out user prompts in a fixed shuffled order (a prefix is a fair subset)."""
        recs = self._split["held_out"]
        order = np.random.default_rng(1234).permutation(len(recs))
        return [recs[int(i)] for i in order]

    def sft_pairs(self, n: int, *, seed: int, step: int) -> list[tuple[str, str]]:
        """``n`` (noisy prompt, canonical caption) training pairs, seeded by ``(seed, step)``; with
        ``sft_rewrite_noise`` p each target is, with probability p, a random spec's caption."""
        train = self.sft_records()
        rng = np.random.default_rng([seed, step, 17])
        picks = [train[int(i)] for i in rng.integers(len(train), size=n)]
        targets = mislabel(
            [str(r.answer) for r in picks], self._captions, self.cfg.sft_rewrite_noise, seed=seed, step=step
        )
        return [(r.prompt, t) for r, t in zip(picks, targets, strict=True)]

    def sft_examples(self, n: int, *, seed: int, step: int) -> tuple[np.ndarray, list[str]]:
        """``n`` renders ``uint8 [n, H, W, 3]`` of canonical captions of every spec (the renderer's SFT)."""
        ex = self.world.sample(n, seed=seed * 1_000_003 + step, split="all")
        return np.stack([e.image for e in ex]), [e.caption for e in ex]
