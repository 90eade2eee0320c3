"""The `unirl` command line: train, sft, eval, recipes, export."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType

from unirl.apps.config import RecipeError, load_dict, shipped_recipes, validate

DEFAULT_RECIPE = "shapes_nft"
"""What `unirl train` (and `./dev run`) runs with no recipe: SFT then DiffusionNFT on the shapes world."""

TRAINERS = {
    "diffusion": "unirl.apps.trainers.diffusion",
    "ar": "unirl.apps.trainers.ar",
    "pe": "unirl.apps.trainers.pe",
    "unified": "unirl.apps.trainers.unified",
}
"""Recipe `trainer:` value -> module with `Recipe` (pydantic) and `run(recipe, run_dir, mode)`."""

EPILOG = """\
examples:
  unirl train                                   # the default: SFT then DiffusionNFT on the shapes world
  unirl train shapes_flowgrpo                   # the same world and SFT, then FlowGRPO
  unirl train arithmetic_grpo rl.steps=40       # another shipped recipe, with an override
  unirl train my_recipe.yaml train.lr=1e-4      # your own recipe file
  unirl sft shapes_nft                          # only the SFT warm-start
  unirl eval runs/shapes_nft-20261201-0400      # held-out evaluation of a run's last checkpoint
  unirl recipes                                 # list shipped recipes
  unirl export runs/sd3_tiny_flowgrpo-20261201-0400 --format diffusers   # the policy as a diffusers pipeline
Every run writes a directory (default runs/<recipe>-<time>/) with config.yaml, metrics.jsonl,
tb/ (TensorBoard), plots/*.png, samples/*.png, checkpoints/ and report.md.
"""


def trainer_module(kind: object) -> ModuleType:
    if kind not in TRAINERS:
        raise RecipeError(
            f"recipe field trainer={kind!r} is not one of {sorted(TRAINERS)}; fix: set trainer to one of them"
        )
    return importlib.import_module(TRAINERS[str(kind)])


def _run(args: argparse.Namespace, mode: str, force_trainer: str | None = None) -> int:
    from unirl.apps.progress import setup_logging

    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    recipe_name = args.recipe or DEFAULT_RECIPE
    data = load_dict(recipe_name, args.overrides)
    kind = force_trainer or data.get("trainer")
    if force_trainer and data.get("trainer", force_trainer) != force_trainer:
        raise RecipeError(
            f"this entry point runs trainer={force_trainer!r}; the recipe says {data['trainer']!r}"
        )
    module = trainer_module(kind)
    recipe = validate(module.Recipe, data, source=f"recipe {recipe_name!r}")
    stem = Path(recipe_name).stem
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"
    return int(module.run(recipe, run_dir, mode=mode, recipe_name=recipe_name) or 0)


def _recipes(_: argparse.Namespace) -> int:
    for name, path in sorted(shipped_recipes().items()):
        first = next((ln[1:].strip() for ln in path.read_text().splitlines() if ln.startswith("#")), "")
        mark = " (default)" if name == DEFAULT_RECIPE else ""
        print(f"{name}{mark}\n    {first}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unirl",
        description="RL post-training for generative models: rollout -> reward -> advantage -> train.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="{train,sft,eval,recipes,export}")

    def add_run(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument(
            "recipe", nargs="?", help=f"shipped recipe name or a .yaml path (default: {DEFAULT_RECIPE})"
        )
        sp.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.steps=20 train.lr=3e-4")
        sp.add_argument("--run-dir", help="where to write the run (default: runs/<recipe>-<time>)")
        sp.add_argument("-v", "--verbose", action="store_true")
        return sp

    add_run("train", "SFT warm-start (if the recipe has one), then RL; evaluates before and after.")
    add_run("sft", "Only the supervised warm-start of a recipe.")
    add_run(
        "eval",
        "Evaluate a recipe's policy (from --run-dir's last checkpoint when given) on held-out prompts.",
    )
    sub.add_parser("recipes", help="List the shipped recipes.")
    ex_help = "Write a run's trained policy as a checkpoint its family's library loads (from_pretrained)."
    ex = sub.add_parser("export", help=ex_help, description=ex_help)
    ex.add_argument("run_dir", help="a run directory (config.yaml + checkpoints/)")
    ex.add_argument(
        "--format", required=True, choices=["hf", "diffusers"], help="hf: AR runs; diffusers: diffusion runs"
    )
    ex.add_argument("--out", help="output folder (default: RUN_DIR/export-<format>)")
    ex.add_argument(
        "--merge-lora", action="store_true", help="fold LoRA into the weights (else: lora/ in peft format)"
    )
    ex.add_argument("--ema", action="store_true", help="export the EMA weights instead of the trained ones")
    return p


def _export(args: argparse.Namespace) -> int:
    from unirl.apps.export import export_run

    dest = export_run(args.run_dir, args.format, out=args.out, merge_lora=args.merge_lora, ema=args.ema)
    print(f"exported {args.run_dir} -> {dest}")
    return 0


def main(argv: list[str] | None = None, *, force_trainer: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if (argv and "=" in argv[0]) or (argv and argv[0].endswith((".yaml", ".yml"))):
        argv = ["train", *argv]  # `unirl recipe.yaml a=b` reads as `unirl train ...`
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    # argparse puts a first override into `recipe` when no recipe is given: move it back.
    if getattr(args, "recipe", None) and "=" in args.recipe:  # a subcommand without `recipe` has none
        args.overrides = [args.recipe, *args.overrides]
        args.recipe = None
    try:
        if args.command == "recipes":
            return _recipes(args)
        if args.command == "export":
            return _export(args)
        return _run(args, mode=args.command, force_trainer=force_trainer)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from unirl.apps.launch import component_failures

        if not isinstance(e, component_failures()):
            raise
        # a worker, the reward server or an engine failed: name it, no traceback of our own loop
        logging.getLogger("unirl").debug("component failure", exc_info=True)
        print(f"error: a component of the run failed: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            "the last checkpoint in the run directory is intact: fix the cause and rerun the same "
            "command with --run-dir to resume",
            file=sys.stderr,
        )
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
