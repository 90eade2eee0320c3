"""Procedural worlds for the embedded default runs: the shapes world (text-to-image) and the
arithmetic world (text). Checkers live in `unirl.reward.worlds`; the feasibility probes
(`python -m unirl.apps.worlds.feasibility`, `... .feasibility_arithmetic`) measure how far SFT gets."""
