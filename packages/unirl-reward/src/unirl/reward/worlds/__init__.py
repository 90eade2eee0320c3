"""Programmatic checkers of unirl's procedural worlds (pure Python + numpy; no torch).

- `shapes_spec`: the shapes-world grammar (specs <-> captions), shared with the generator.
- `shapes_checker`: GenEval-style checker of an RGB image against a spec or caption.
- `arithmetic_checker`: exact match of a completion's final integer.
"""

from unirl.reward.worlds.arithmetic_checker import ArithmeticCheck, check_answer, parse_final_integer
from unirl.reward.worlds.shapes_checker import CheckerConfig, CheckResult, check_image, detect_objects
from unirl.reward.worlds.shapes_spec import ObjectGroup, ShapesSpec, all_specs, parse_caption, spec_to_caption

__all__ = [
    "ArithmeticCheck",
    "CheckResult",
    "CheckerConfig",
    "ObjectGroup",
    "ShapesSpec",
    "all_specs",
    "check_answer",
    "check_image",
    "detect_objects",
    "parse_caption",
    "parse_final_integer",
    "spec_to_caption",
]
