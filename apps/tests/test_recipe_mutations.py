"""Recipe mutations: 32 broken variants of the shipped recipes, each rejected before any model exists.

Every mutation goes through the real entry point, ``unirl train RECIPE a.b=value``
(``unirl.apps.cli.main``), with the trainers' ``run`` and every model config's ``build`` replaced
by a sentinel that records the call: a mutation counts as caught only when the CLI exits with 2
and the sentinel never fired. The message must name the field path, the value received and a fix.

The typo, wrong-type and unknown-kind mutations are drawn with a seeded RNG from the recipes' own
fields (``SEED``); the out-of-range ones and the conflicting options are listed by hand, since
which values are out of range is what the config models declare. The control test shows the
sentinel does fire for each unmutated recipe, so "never fired" is evidence, not an accident.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import pytest

from unirl.apps import cli
from unirl.apps.config import load_dict, shipped_recipes

SEED = 23  # issue 23
RECIPES = sorted(shipped_recipes())
RL_RECIPES = ["arithmetic_dapo", "arithmetic_grpo", "sd3_tiny_flowgrpo", "shapes_flowgrpo", "shapes_nft"]


@dataclass(frozen=True)
class Mutation:
    category: str
    recipe: str
    overrides: tuple[str, ...]
    expect: tuple[str, ...]  # fragments the message must hold: the path, the value, the fix

    @property
    def id(self) -> str:
        return f"{self.category}:{self.recipe}:{' '.join(self.overrides)}"


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) of every scalar leaf of a recipe's data, list elements by index."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out: list[tuple[str, Any]] = []
    for k, v in items:
        path = f"{prefix}{k}"
        out += _leaves(v, f"{path}.") if isinstance(v, dict | list) else [(path, v)]
    return out


def _kind_sections(node: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every section of a recipe that selects an implementation by ``kind``."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = [prefix.rstrip(".")] if isinstance(node, dict) and "kind" in node and prefix else []
    for k, v in items:
        out += _kind_sections(v, f"{prefix}{k}.")
    return out


def _typo(name: str, rng: random.Random) -> str:
    """``name`` with one seeded keyboard slip: a dropped, doubled or swapped letter."""
    i = rng.randrange(len(name) - 1)
    op = rng.choice(["drop", "double", "swap"])
    if op == "drop":
        return name[:i] + name[i + 1 :]
    if op == "double":
        return name[: i + 1] + name[i] + name[i + 1 :]
    return name[:i] + name[i + 1] + name[i] + name[i + 2 :]


def _seeded_mutations(rng: random.Random, n_typo: int, n_type: int, n_kind: int) -> list[Mutation]:
    data = {r: load_dict(r) for r in RECIPES}
    out: list[Mutation] = []
    while len(out) < n_typo:  # wrong field name: an existing numeric field, misspelt
        recipe = rng.choice(RECIPES)
        path, value = rng.choice([(p, v) for p, v in _leaves(data[recipe]) if type(v) in (int, float)])
        *head, name = path.split(".")
        bad = _typo(name, rng)
        siblings = set(_section(data[recipe], head))
        if len(name) < 3 or bad in siblings:
            continue
        bad_path = ".".join([*head, bad])
        out.append(
            Mutation(
                "typo", recipe, (f"{bad_path}={json.dumps(value)}",), (f"{bad_path}:", repr(value), name)
            )
        )
    words = ["forty", "abc", "high", "1e-3x", "two"]
    while len(out) < n_typo + n_type:  # wrong type: a numeric field given a word
        recipe = rng.choice(RECIPES)
        path, _ = rng.choice([(p, v) for p, v in _leaves(data[recipe]) if type(v) in (int, float)])
        word = rng.choice(words)
        out.append(
            Mutation("type", recipe, (f"{path}={word}",), (f"{path}:", repr(word), f"fix: set {path} to"))
        )
    bogus = ["ppo", "flux", "deepspeed", "gsm8k", "cosinex", "sglang2", "magic"]
    while len(out) < n_typo + n_type + n_kind:  # unknown kind in a section that selects by kind
        recipe = rng.choice(RECIPES)
        section = rng.choice(_kind_sections(data[recipe]))
        name = rng.choice(bogus)
        # "section:" (a union of kinds) or "section.kind:" (a section with one kind: a plain literal)
        expect = (f"{section}", repr(name), f"fix: set {section}.kind to one of")
        out.append(Mutation("kind", recipe, (f"{section}.kind={name}",), expect))
    return out


def _section(data: dict[str, Any], head: list[str]) -> Any:
    node: Any = data
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    return node


RANGE = [  # out-of-range values: what each field's declared bounds exclude
    Mutation(
        "range",
        "arithmetic_grpo",
        ("rl.samples_per_prompt=0",),
        ("rl.samples_per_prompt:", "(got 0)", ">= 1"),
    ),
    Mutation(
        "range", "arithmetic_dapo", ("sampling.temperature=-1",), ("sampling.temperature:", "(got -1)", "> 0")
    ),
    Mutation("range", "smollm2_grpo", ("sampling.top_p=1.5",), ("sampling.top_p:", "(got 1.5)", "<= 1")),
    Mutation("range", "shapes_flowgrpo", ("sampling.eta=-0.5",), ("sampling.eta:", "(got -0.5)", ">= 0")),
    Mutation(
        "range",
        "shapes_flowgrpo",
        ("sampling.sde_schedule.k=20",),
        ("sde_schedule.k=20", "num_steps=10", "lower k"),
    ),
    # caught only since this suite: transformers builds a model whose attention is narrower than it
    Mutation(
        "range",
        "arithmetic_grpo",
        ("model.tiny.num_heads=3",),
        ("model.tiny", "num_heads=3", "hidden_size=128", "pick num_heads among the divisors"),
    ),
]

CONFLICT = [  # options each valid alone, impossible together
    Mutation(
        "conflict",
        "arithmetic_grpo",
        ("backend.lora={r: 4, alpha: 8, target_modules: [q_proj]}", "rollout.engine.kind=vllm"),
        ("rollout.engine.kind='vllm'", "backend.lora", "drop backend.lora or use kind='trainside'"),
    ),
    Mutation(
        "conflict",
        "shapes_flowgrpo",
        ("backend.reference=none",),
        ("rl.algorithm.kl_coef=0.1", "backend.reference='none'", "set backend.reference=frozen_copy"),
    ),
    Mutation(
        "conflict",
        "arithmetic_grpo",
        ("rl.lifecycle=async", "layout.kind=ray", "layout.sync=broadcast"),
        ("rl.lifecycle='async'", "layout.sync='broadcast'", "use sync='buckets' or 'shm'"),
    ),
    Mutation(
        "conflict",
        "arithmetic_dapo",
        ("rl.algorithm.off_policy.mode=truncate", "rl.algorithm.off_policy.cap=2.0"),
        ("rl.algorithm:", "old_logprobs='rollout'", "set old_logprobs: recompute or drop off_policy"),
    ),
    Mutation(
        "conflict",
        "shapes_flowgrpo",
        ("rl.algorithm.off_policy.mode=truncate", "rl.algorithm.off_policy.cap=2.0"),
        ("rl.algorithm:", "old_logprobs='rollout'", "set old_logprobs: recompute or drop off_policy"),
    ),
    Mutation(
        "conflict",
        "shapes_nft",
        ("backend.ema=null",),
        ("rl.algorithm.kind=diffusion_nft", "backend.ema=None", "set backend.ema={decay: 0.5, ramp: 0.001}"),
    ),
    Mutation(
        "conflict",
        "arithmetic_grpo",
        ("rl.lifecycle=async", "rollout.engine.kind=vllm", "rl.buffer.partial_rollouts=true"),
        ("rl.buffer.partial_rollouts=true", "rollout.engine.kind='vllm'", "use kind='trainside' or drop it"),
    ),
    Mutation(
        "conflict",
        "arithmetic_grpo_megatron",
        ("backend.tensor_model_parallel_size=2", "layout.kind=ray"),
        ("backend.tensor_model_parallel_size=2", "layout.kind='ray'", "use tensor_model_parallel_size: 1"),
    ),
    Mutation(
        "conflict",
        "arithmetic_grpo_megatron",
        ("backend.pipeline_model_parallel_size=2", "layout.kind=ray"),
        (
            "backend.pipeline_model_parallel_size=2",
            "layout.kind='ray'",
            "use pipeline_model_parallel_size: 1",
        ),
    ),
    Mutation(
        "conflict",
        "arithmetic_grpo_megatron",
        (
            "backend.pipeline_model_parallel_size=2",
            "backend.reference=frozen_copy",
            "rl.algorithm.kl_coef=0.1",
        ),
        ("rl.algorithm.kl_coef=0.1", "backend.pipeline_model_parallel_size=2", "use kl_coef: 0"),
    ),
    # caught only since this suite: the U-Net would meet images of another size at the first step
    Mutation(
        "conflict",
        "shapes_nft",
        ("sampling.height=24",),
        ("sampling.height=24", "model.resolution=32", "set sampling.height=32 sampling.width=32"),
    ),
]

MUTATIONS = _seeded_mutations(random.Random(SEED), n_typo=5, n_type=5, n_kind=5) + RANGE + CONFLICT
assert len(MUTATIONS) == 32


class _Built(Exception):
    """Raised by the sentinels: the CLI got past validation to building a run or a model."""


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every trainer's ``run`` and the model configs' ``build`` replaced by a recording sentinel."""
    from unirl.apps import models
    from unirl.rollout.ar.config import CausalLMConfig

    calls: list[str] = []

    def sentinel(name: str) -> Any:
        def fire(*_: Any, **__: Any) -> Any:
            calls.append(name)
            raise _Built(name)

        return fire

    for kind in cli.TRAINERS:  # every trainer the CLI can dispatch to
        monkeypatch.setattr(cli.trainer_module(kind), "run", sentinel(f"{kind}.run"))
    for cfg in (CausalLMConfig, models.SD3ModelConfig, models.TinyShapesModelConfig):
        monkeypatch.setattr(cfg, "build", sentinel(f"{cfg.__name__}.build"))
    return calls


def _train(recipe: str, overrides: tuple[str, ...], tmp_path: Any) -> int:
    return cli.main(["train", recipe, *overrides, "--run-dir", str(tmp_path / "run")])


@pytest.mark.parametrize("recipe", RECIPES)
def test_unmutated_recipe_reaches_the_build(recipe: str, built: list[str], tmp_path: Any) -> None:
    """The control: without a mutation the CLI does get to the (patched) run."""
    with pytest.raises(_Built):
        _train(recipe, (), tmp_path)
    assert built  # a trainer's run (or, before it, a model build) was reached


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.id)
def test_mutation_rejected_before_any_model(
    m: Mutation, built: list[str], tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = _train(m.recipe, m.overrides, tmp_path)
    except _Built:
        pytest.fail(f"{m.id}: not caught, the run was started ({built})")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert not built
    assert not (tmp_path / "run").exists()  # not even the run directory
    missing = [frag for frag in m.expect if frag not in err]
    assert not missing, f"{m.id}: message lacks {missing}:\n{err}"


def test_mutation_mix() -> None:
    """Every category is represented, and the seeded draw did not repeat itself."""
    cats = [m.category for m in MUTATIONS]
    assert {c: cats.count(c) for c in set(cats)} == {
        "typo": 5,
        "type": 5,
        "kind": 5,
        "range": 6,
        "conflict": 11,
    }
    assert len({(*m.overrides, m.recipe) for m in MUTATIONS}) == len(MUTATIONS)
