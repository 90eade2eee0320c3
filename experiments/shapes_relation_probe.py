"""Does a shapes policy read the relation words? Same initial noise, four captions that differ only
in the relation (or in word order), ODE samples from the run's checkpoint.

    python experiments/shapes_relation_probe.py RUN_DIR [override ...]   # overrides the run used (seed=...)

Prints the mean absolute pixel difference (0..255) of each variant to the first caption and, per
caption, the mean column offset of the red mass from the blue mass (negative = red further left).
A policy that reads the relation puts red ~15 pixels left of blue for "red left of blue" and
~15 right for "blue left of red" (the training images do); one that ignores it prints the same
offset for all four.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from shapes_checks import load_policy  # experiments/ is on sys.path when this file runs

from unirl.apps.loop import PromptRecord
from unirl.reward.worlds.shapes_checker import CheckerConfig, colour_masks
from unirl.types import to_numpy

CAPTIONS = (
    "a red circle left of a blue square",
    "a blue square left of a red circle",
    "a red circle right of a blue square",
    "a red circle above a blue square",
)


def main(run: Path, overrides: list[str], k: int = 16) -> None:
    trainer = load_policy(run, overrides, "probe")
    images, params = {}, trainer.eval_params()
    for caption in CAPTIONS:  # one record id for all: every caption starts from the same k noises
        samples = trainer.sample_prompts([PromptRecord(id="probe", prompt=caption)], k, params)
        images[caption] = np.stack(
            [np.asarray(to_numpy(s.part(trainer.stage).outputs[0].pixels)) for s in samples]
        )
    first = images[CAPTIONS[0]].astype(np.float64)
    for caption, imgs in images.items():
        offsets = []
        for img in imgs:
            masks = colour_masks(img, CheckerConfig())
            if masks["red"].any() and masks["blue"].any():
                offsets.append(np.nonzero(masks["red"])[1].mean() - np.nonzero(masks["blue"])[1].mean())
        diff = np.abs(imgs.astype(np.float64) - first).mean()
        offset = f"{np.mean(offsets):+.1f}" if offsets else "n/a"
        print(f"{caption!r:40} pixel diff to the first {diff:6.2f}  red - blue column {offset} "
              f"({len(offsets)}/{k} with both colours)")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:])
