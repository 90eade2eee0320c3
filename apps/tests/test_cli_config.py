"""CLI and recipe validation: clear errors naming the field before any compute."""

from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from unirl.apps import cli
from unirl.apps.cli import trainer_module
from unirl.apps.config import RecipeError, load, load_dict, shipped_recipes, validate


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    micro_batch_size: int = Field(ge=1)


class Toy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    trainer: Literal["toy"]
    train: Inner
    name: str = "${trainer}-run"


def write(tmp_path, text):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return str(p)


def test_overrides_and_interpolation(tmp_path):
    r = write(tmp_path, "trainer: toy\ntrain: {micro_batch_size: 2}\nname: ${trainer}-x\n")
    cfg = load(Toy, r, ["train.micro_batch_size=4"])
    assert cfg.train.micro_batch_size == 4 and cfg.name == "toy-x"


def test_override_of_kind_replaces_the_node():
    """A new `kind` starts the node afresh; the same kind merges field by field."""
    algo = load_dict(
        "shapes_flowgrpo", ["rl.algorithm.kind=diffusion_nft", "rl.algorithm.timesteps_per_sample=2"]
    )
    assert algo["rl"]["algorithm"] == {"kind": "diffusion_nft", "timesteps_per_sample": 2}
    kept = load_dict("shapes_flowgrpo", ["rl.algorithm.kind=flow_grpo", "rl.algorithm.kl_coef=0.3"])
    assert kept["rl"]["algorithm"] == {"kind": "flow_grpo", "clip_range": 1.0e-3, "kl_coef": 0.3}
    nested = load_dict("shapes_flowgrpo", ["sampling.sde_schedule={kind: all}"])
    assert nested["sampling"]["sde_schedule"] == {"kind": "all"}
    assert nested["sampling"]["eta"] == 0.7  # siblings of the replaced node are kept
    data = load_dict(
        "shapes_flowgrpo", ["rl.algorithm={kind: diffusion_nft}", "backend.ema={decay: 0.5, ramp: 0.001}"]
    )
    assert validate(trainer_module("diffusion").Recipe, data).rl.algorithm.kind == "diffusion_nft"


def test_base_recipe_is_merged_under_the_file(tmp_path):
    """`base:` loads a shipped recipe or a sibling file first; a node with a new kind replaces it."""
    (tmp_path / "parent.yaml").write_text("trainer: toy\ntrain: {micro_batch_size: 2}\nname: p\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: parent.yaml\nname: c\n")
    cfg = load(Toy, str(child), ["train.micro_batch_size=5"])
    assert (cfg.name, cfg.train.micro_batch_size) == ("c", 5)
    nft = load_dict("shapes_nft")
    stop = {"metric": "geneval/relation", "at_least": 0.45, "every": 100, "min_steps": 1000}
    stop |= {"num_prompts": 64, "samples_per_prompt": 2}
    flow = load_dict("shapes_flowgrpo")
    assert nft["model"] == flow["model"] and nft["sft"] == {**flow["sft"], "steps": 2400, "stop": stop}
    assert nft["data"] == {**flow["data"], "sft_caption_noise": 0.3}  # merged node by node
    assert nft["rl"]["algorithm"] == {"kind": "diffusion_nft", "timesteps_per_sample": 2, "kl_coef": 1.0}
    assert nft["sampling"]["sde_strategy"] == "ode" and "base" not in nft
    (tmp_path / "parent.yaml").write_text("base: child.yaml\ntrainer: toy\n")
    with pytest.raises(RecipeError, match=r"`base` chain loops \(child.yaml -> parent.yaml -> child.yaml\)"):
        load_dict(str(child))


def test_nft_recipe_needs_the_matching_ema():
    """DiffusionNFT's old policy is the backend EMA: a missing or different one fails at load."""
    Recipe = trainer_module("diffusion").Recipe
    assert validate(Recipe, load_dict("shapes_nft")).backend.ema is not None
    for bad in ("backend.ema=null", "backend.ema.decay=0.9"):
        with pytest.raises(RecipeError, match=r"set backend.ema=\{decay: 0.5, ramp: 0.001\}"):
            validate(Recipe, load_dict("shapes_nft", [bad]))


def test_typo_names_the_path(tmp_path):
    r = write(tmp_path, "trainer: toy\ntrain: {micro_batch_sise: 2}\n")
    with pytest.raises(RecipeError) as e:
        load(Toy, r)
    assert "train.micro_batch_sise: Extra inputs are not permitted" in str(e.value)
    assert "train.micro_batch_size: Field required" in str(e.value)


def test_impossible_value_names_field_and_value(tmp_path):
    r = write(tmp_path, "trainer: toy\ntrain: {micro_batch_size: 2}\n")
    with pytest.raises(
        RecipeError, match=r"train.micro_batch_size: Input should be greater than or equal to 1 \(got 0\)"
    ):
        load(Toy, r, ["train.micro_batch_size=0"])


def test_bad_override_and_unknown_recipe(tmp_path):
    r = write(tmp_path, "trainer: toy\n")
    with pytest.raises(RecipeError, match="not of the form a.b=value"):
        load_dict(r, ["train.micro_batch_size"])
    with pytest.raises(RecipeError, match="unknown recipe 'nope'; shipped recipes"):
        load_dict("nope")


def test_cli_unknown_trainer_is_exit_2(tmp_path, capsys):
    r = write(tmp_path, "trainer: quantum\n")
    assert cli.main(["train", r]) == 2
    assert "trainer='quantum' is not one of ['ar', 'diffusion', 'pe', 'unified']" in capsys.readouterr().err


def test_cli_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for word in ("train", "sft", "eval", "recipes", "report.md"):
        assert word in out


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_every_shipped_recipe_validates(name: str) -> None:
    """Each recipe `unirl recipes` lists loads into its trainer's typed Recipe with no overrides."""
    data = load_dict(name)
    recipe = validate(trainer_module(data["trainer"]).Recipe, data, source=f"recipe {name!r}")
    assert recipe.trainer == data["trainer"]


def test_override_of_a_list_element_merges_into_it(tmp_path):
    """`a.0.b=v` sets a field of the list's element 0; a new `kind` there replaces that node
    (its old keys dropped) as it does in a mapping; the other elements and fields are kept."""
    data = load_dict("arithmetic_grpo", ["reward.scorers.0.weight=2", "data.levels.1=3"])
    assert data["reward"]["scorers"] == [{"name": "exact", "weight": 2, "scorer": {"kind": "arithmetic"}}]
    assert data["data"]["levels"] == [0, 3, 2, 4]
    swapped = load_dict(
        "arithmetic_grpo",
        ["reward.scorers.0.scorer.kind=exact_match", "reward.scorers.0.scorer.extractor=raw"],
    )
    assert swapped["reward"]["scorers"][0]["scorer"] == {"kind": "exact_match", "extractor": "raw"}
    assert validate(trainer_module("ar").Recipe, swapped).reward.scorers[0].weight == 1.0
    r = write(tmp_path, "trainer: toy\nitems:\n  - {kind: a, x: 1, y: '${trainer}'}\n  - {kind: b, z: 2}\n")
    items = load_dict(r, ["items.0.kind=c", "items.1.z=3"])["items"]
    assert items == [{"kind": "c"}, {"kind": "b", "z": 3}]
    assert load_dict(r, ["items.0.x=5"])["items"][0] == {"kind": "a", "x": 5, "y": "toy"}


def test_bad_list_element_override_names_the_field(tmp_path, capsys):
    """A bad kind fails as in the YAML, at the element's field path; an index past the end names
    the list, its indices and how to give a whole list."""
    bad = ["train", "arithmetic_grpo", "reward.scorers.0.scorer.kind=exact_mach"]
    assert cli.main(bad) == 2
    err = capsys.readouterr().err
    assert "reward.scorers.0.scorer: Input tag 'exact_mach' found using 'kind' does not match" in err
    assert "'exact_match'" in err
    with pytest.raises(RecipeError, match=r"reward.scorers.3: reward.scorers is a list of 1 element\(s\), "
                       r"index '3' is not one of its indices \(0..0\); .* reward.scorers=\[...\]"):  # fmt: skip
        load_dict("arithmetic_grpo", ["reward.scorers.3.weight=2"])
    with pytest.raises(RecipeError, match=r"data.levels.x: data.levels is a list of 4"):
        load_dict("arithmetic_grpo", ["data.levels.x=2"])


def test_vlm_recipe_is_listed_and_its_model_kind_validates(capsys):
    """shapes_vqa_grpo ships (``unirl recipes`` lists it); ``model.kind: vlm`` needs a source."""
    assert cli.main(["recipes"]) == 0
    assert "shapes_vqa_grpo\n    SFT a tiny Qwen2.5-VL" in capsys.readouterr().out
    recipe = validate(trainer_module("ar").Recipe, load_dict("shapes_vqa_grpo"))
    assert recipe.model.kind == "vlm" and recipe.data.kind == "shapes_vqa"
    with pytest.raises(RecipeError, match=r"needs model.path \(a checkpoint\) or model.tiny"):
        validate(trainer_module("ar").Recipe, load_dict("shapes_vqa_grpo", ["model.tiny=null"]))
    with pytest.raises(RecipeError, match="patch_size"):
        validate(trainer_module("ar").Recipe, load_dict("shapes_vqa_grpo", ["model.tiny.patch_size=5"]))
