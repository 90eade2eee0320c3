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
    assert "trainer='quantum' is not one of ['ar', 'diffusion']" in capsys.readouterr().err


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
