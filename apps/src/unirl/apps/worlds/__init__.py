"""Procedural worlds for the embedded default runs: the shapes world (text-to-image) and the
arithmetic world (text). Checkers live in `unirl.reward.worlds`; the feasibility probes that
measure how far SFT gets are lab scripts outside the package (`experiments/feasibility*.py`)."""
