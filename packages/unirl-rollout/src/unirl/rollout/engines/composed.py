"""``ComposedEngine`` (kind ``composed``): engines chained stage after stage (the prompt enhancer).

Stage ``i`` fills the Part named ``stages[i][0]``; every later stage is conditioned on the one
before it: its Part is created with ``parent`` = the previous stage's name before its engine runs,
and that engine reads its prompt from the parent's text (``FlowMatchPipeline(prompt_part=...)``,
``RemoteDiffusionEngine(prompt_part=...)``, ``ARPipeline(parent=...)``). The result is one
Sample whose Parts form the lineage, e.g. ``ar`` (the rewrite) -> ``diffusion`` (its render).

Any RolloutEngine can be a stage (trainside, SGLang, vLLM, the HTTP diffusion engines); weight
syncs go to the stage engines themselves (``engines``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unirl.rollout.engines.base import RolloutEngine
from unirl.types import Sample, TextPrimitive

__all__ = ["ComposedEngine", "ComposedEngineConfig"]

EmptyText = Literal["keep", "error"]


class ComposedEngine:
    """Runs ``stages`` in order over the same Samples.

    Args:
        stages: ``(part name, engine)`` pairs; each engine fills the Part of that name.
        empty_text: a parent Part with empty text: ``"keep"`` renders the empty prompt (the
            reward then scores it: the honest RL signal for a rewriter that emitted nothing),
            ``"error"`` raises naming the sample.
    """

    def __init__(
        self, stages: Sequence[tuple[str, RolloutEngine]], *, empty_text: EmptyText = "keep"
    ) -> None:
        if len(stages) < 2:
            raise ValueError(f"a composed engine chains >= 2 stages; got {[n for n, _ in stages]}")
        names = [n for n, _ in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique; got {names}")
        for n, e in stages:
            if not isinstance(e, RolloutEngine):
                raise TypeError(
                    f"stage {n!r}: {type(e).__name__} is not a RolloutEngine (generate/wake_up/sleep)"
                )
        self.stages = list(stages)
        self.empty_text = empty_text

    @property
    def engines(self) -> dict[str, RolloutEngine]:
        """The stage engines by Part name (weight syncs target these)."""
        return dict(self.stages)

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Run every stage; each Sample comes back with one Part per stage, parent-linked."""
        parent: str | None = None
        for name, engine in self.stages:
            if parent is not None:
                for s in samples:
                    self._check_parent(s, parent)
                    part = s.ensure_part(name, parent=parent)
                    if part.parent != parent:
                        raise ValueError(
                            f"sample {s.id!r}: part {name!r} already exists with parent {part.parent!r}, "
                            f"but the composed engine conditions it on {parent!r}"
                        )
            out = engine.generate(samples, rollout_step=rollout_step)
            if [s.id for s in out] != [s.id for s in samples]:
                raise ValueError(f"stage {name!r} returned other samples than it was given")
            for s in out:
                p = s.part(name)
                if p.status not in ("completed", "truncated", "aborted"):
                    raise ValueError(f"sample {s.id!r}: stage {name!r} left its part {p.status!r}")
            samples, parent = out, name
        return samples

    def _check_parent(self, s: Sample, parent: str) -> None:
        p = s.part(parent)
        if p.status == "aborted":
            raise ValueError(f"sample {s.id!r}: stage {parent!r} aborted; it cannot condition the next stage")
        texts = [o for o in p.outputs if isinstance(o, TextPrimitive)]
        if not texts:
            raise ValueError(
                f"sample {s.id!r}: stage {parent!r} produced no text output to condition the next stage on"
            )
        if not texts[0].text.strip() and self.empty_text == "error":
            raise ValueError(f"sample {s.id!r}: stage {parent!r} produced empty text (empty_text='error')")

    def wake_up(self) -> None:
        for _, e in self.stages:
            e.wake_up()

    def sleep(self) -> None:
        for _, e in self.stages:
            e.sleep()


class ComposedEngineConfig(BaseModel):
    """``rollout.engine.kind: composed``: the stage names in order; the recipe builds each stage's engine.

    The stage engines come from their own configs (e.g. ``sglang_llm`` for ``ar``, ``sglang`` /
    ``vllm_omni`` / trainside for ``diffusion``), each with its prompt taken from the previous
    stage (``parent`` / ``prompt_part``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["composed"] = "composed"
    stages: list[str] = Field(default_factory=lambda: ["ar", "diffusion"], min_length=2)
    empty_text: EmptyText = "keep"

    @model_validator(mode="after")
    def _unique(self) -> ComposedEngineConfig:
        if len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages must be unique; got {self.stages}")
        return self

    def build(self, engines: Sequence[RolloutEngine]) -> ComposedEngine:
        """Chain ``engines`` (one per stage, in order)."""
        if len(engines) != len(self.stages):
            raise ValueError(f"{len(engines)} engines for stages {self.stages}")
        return ComposedEngine(list(zip(self.stages, engines)), empty_text=self.empty_text)
