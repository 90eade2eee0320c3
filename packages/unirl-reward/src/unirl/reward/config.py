"""Typed scorer/service configs: `kind` selects the scorer, `build()` makes it (YAML-friendly).

```yaml
scorers:
  - {name: answer, weight: 1.0, scorer: {kind: math_verify, timeout_s: 5}}
  - {name: fmt, weight: 0.1, scorer: {kind: format, pattern: "<think>.*</think>.*"}}
```
A wrong `kind` fails at load listing the options. `kind: plugin` with `target: "pkg.mod:factory"`
is the escape hatch for out-of-tree scorers.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.reward.combine import WeightedScorer, check_unique
from unirl.reward.models.configs import MODEL_CONFIGS
from unirl.reward.protocol import Scorer

_STRICT = ConfigDict(extra="forbid", frozen=True)


class JpegConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["jpeg"] = "jpeg"
    direction: Literal["compressibility", "incompressibility"] = "incompressibility"
    quality: int = Field(95, ge=1, le=100, description="JPEG quality used to measure size.")

    def build(self) -> Scorer:
        from unirl.reward.rules.jpeg import JpegScorer

        return JpegScorer(self.direction, self.quality)


class ExactMatchConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["exact_match"] = "exact_match"
    extractor: Literal["boxed", "gsm8k", "last_number", "raw"] = "boxed"

    def build(self) -> Scorer:
        from unirl.reward.rules.exact import ExactMatchScorer

        return ExactMatchScorer(self.extractor)


class MathVerifyConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["math_verify"] = "math_verify"
    timeout_s: float = Field(5.0, gt=0, description="Per-sample wall-clock bound; a timeout scores 0.")

    def build(self) -> Scorer:
        from unirl.reward.rules.math import MathVerifyScorer

        return MathVerifyScorer(timeout_s=self.timeout_s, eager_start=True)


class MultipleChoiceConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["multiple_choice"] = "multiple_choice"
    letters: str = Field("ABCD", pattern=r"^[A-Z]{2,26}$")

    def build(self) -> Scorer:
        from unirl.reward.rules.choice import MultipleChoiceScorer

        return MultipleChoiceScorer(self.letters)


class FormatConfig(BaseModel):
    model_config = _STRICT
    kind: Literal["format"] = "format"
    pattern: str
    mode: Literal["fullmatch", "search"] = "fullmatch"

    def build(self) -> Scorer:
        from unirl.reward.rules.format import FormatScorer

        return FormatScorer(self.pattern, self.mode)


class PluginConfig(BaseModel):
    """An out-of-tree scorer: `target` "module:factory" is called with `kwargs`."""

    model_config = _STRICT
    kind: Literal["plugin"] = "plugin"
    target: str = Field(pattern=r"^[\w.]+:[\w]+$")
    kwargs: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> Scorer:
        module, _, attr = self.target.partition(":")
        scorer = getattr(importlib.import_module(module), attr)(**self.kwargs)
        if not isinstance(scorer, Scorer):
            raise TypeError(f"plugin {self.target!r} returned {type(scorer).__name__}, which is not a Scorer")
        return scorer


class ShapesConfig(BaseModel):
    """The shapes-world GenEval-style checker (count, colour, shape, relative position) on pixels."""

    model_config = _STRICT
    kind: Literal["shapes"] = "shapes"
    reward: Literal["score", "correct"] = Field(
        "score", description="score: fraction of checks passed (dense, for RL); correct: 1 only if all pass"
    )
    check_shape: bool = True

    def build(self) -> Scorer:
        from unirl.reward.worlds.scorer import ShapesScorer

        return ShapesScorer(reward=self.reward, check_shape=self.check_shape)


class MovingShapesConfig(BaseModel):
    """The moving-shapes video checker (colour, shape, direction of motion; frame-level rates)."""

    model_config = _STRICT
    kind: Literal["moving_shapes"] = "moving_shapes"
    reward: Literal["score", "correct"] = Field(
        "score",
        description="score: mean of object, shape and motion (dense, for RL); correct: 1 only if all pass",
    )
    check_shape: bool = True
    min_travel: float = Field(2.0, gt=0, description="centroid travel (pixels) that counts as motion")

    def build(self) -> Scorer:
        from unirl.reward.worlds.moving_shapes import MovingShapesScorer

        return MovingShapesScorer(
            reward=self.reward, check_shape=self.check_shape, min_travel=self.min_travel
        )


class ArithmeticConfig(BaseModel):
    """Exact integer match of the response's answer against the reference (the arithmetic world)."""

    model_config = _STRICT
    kind: Literal["arithmetic"] = "arithmetic"

    def build(self) -> Scorer:
        from unirl.reward.worlds.scorer import ArithmeticScorer

        return ArithmeticScorer()


ScorerConfig = Annotated[
    JpegConfig
    | ExactMatchConfig
    | MathVerifyConfig
    | MultipleChoiceConfig
    | FormatConfig
    | ShapesConfig
    | MovingShapesConfig
    | ArithmeticConfig
    | PluginConfig
    | MODEL_CONFIGS,
    Field(discriminator="kind"),
]


class ScorerEntry(BaseModel):
    """One weighted scorer. `name` (default: the kind) names its component in the reward."""

    model_config = _STRICT
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    weight: float = Field(1.0, allow_inf_nan=False)
    scorer: ScorerConfig

    @property
    def resolved_name(self) -> str:
        return self.name or self.scorer.kind


class RemoteConfig(BaseModel):
    """Score through a running reward server (`unirl-reward serve`) instead of in this process.

    ```yaml
    reward:
      scorers: [{name: geneval, scorer: {kind: shapes}}]   # what the server must score with
      remote: {url: "http://127.0.0.1:8000", token_env: UNIRL_REWARD_TOKEN}
    ```
    The recipe still lists its scorers: at start the client asks the server for its scorer names
    and weights (`GET /v1/version`) and refuses a server that scores with others. A server that
    dies or stops answering fails the run within `max_attempts` tries of `timeout_s` each (plus
    at most `max_attempts` x 5 s of backoff), with an error naming the server.
    """

    model_config = _STRICT
    url: str = Field(pattern=r"^https?://", description="base URL of the reward server")
    token_env: str | None = Field(
        None, description="environment variable holding the bearer token (never the token itself)"
    )
    timeout_s: float = Field(60.0, gt=0, description="per-request timeout (one HTTP attempt)")
    max_attempts: int = Field(6, ge=1, le=100, description="tries of one request before the run fails")
    media: Literal["png", "jpeg", "array"] = Field(
        "png", description="image encoding on the wire (png: lossless; array: raw uint8)"
    )
    check_scorers: bool = Field(
        True, description="refuse a server whose scorer names / weights differ from `scorers`"
    )


class ServiceConfig(BaseModel):
    """The scorers of a RewardService (local) or of the reward server; `remote` sends the items to
    a reward server that scores with these scorers."""

    model_config = _STRICT
    scorers: list[ScorerEntry] = Field(min_length=1)
    remote: RemoteConfig | None = Field(
        None, description="score on this reward server instead of in-process (None: in-process)"
    )

    @model_validator(mode="after")
    def _unique(self) -> ServiceConfig:
        names = [e.resolved_name for e in self.scorers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(
                f"scorer names must be unique, repeated: {dup}; give each entry a distinct `name`"
            )
        return self

    def build(self) -> list[WeightedScorer]:
        out = [WeightedScorer(e.resolved_name, e.weight, e.scorer.build()) for e in self.scorers]
        check_unique(out)
        return out

    @classmethod
    def from_yaml(cls, path: str | Path) -> ServiceConfig:
        import yaml

        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping with a `scorers:` list, got {type(data).__name__}")
        return cls.model_validate(data)
