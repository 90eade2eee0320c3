"""Video PickScore: PickScore of evenly spaced frames against the prompt, averaged.

total = mean over frames of logit_scale.exp() * cos(frame, prompt); components give the
min and max frame score so temporal failures (one bad frame) stay visible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unirl.reward.models.clip import ClipBackbone
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs


def frame_indices(num_frames: int, max_frames: int) -> list[int]:
    """Evenly spaced frame indices including the first and last (all when num_frames <= max_frames).

    >>> frame_indices(10, 4)
    [0, 3, 6, 9]
    """
    if num_frames <= max_frames:
        return list(range(num_frames))
    if max_frames == 1:
        return [0]
    return [round(i * (num_frames - 1) / (max_frames - 1)) for i in range(max_frames)]


class VideoPickScoreScorer:
    modality: Modality = "video+text"
    output_range = (-100.0, 100.0)
    name = "video_pickscore"

    def __init__(self, backbone: ClipBackbone, max_frames: int = 16, version: str = "1") -> None:
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.backbone, self.max_frames, self.version = backbone, max_frames, f"{version}+f{max_frames}"

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
        processor_path: str | None = None,
        max_frames: int = 16,
    ) -> VideoPickScoreScorer:
        bb = ClipBackbone.from_pretrained(
            model_path, device, dtype, batch_size, processor_path, extra="video"
        )
        return cls(bb, max_frames, version=f"1+{model_path.rstrip('/').split('/')[-1]}+{dtype}")

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        if not items:
            return []
        frames: list[np.ndarray] = []
        owner: list[int] = []
        for i, it in enumerate(items):
            assert it.video is not None
            for k in frame_indices(len(it.video), self.max_frames):
                frames.append(it.video[k])
                owner.append(i)
        img = self.backbone.image_embeds(frames)  # all frames of all videos, batched together
        txt = self.backbone.text_embeds([it.prompt or "" for it in items])
        per_frame = (self.backbone.logit_scale() * (img * txt[owner]).sum(-1)).tolist()
        out = []
        for i in range(len(items)):
            s = [v for v, o in zip(per_frame, owner) if o == i]
            out.append(
                ScoreResult(total=float(np.mean(s)), components={"frame_min": min(s), "frame_max": max(s)})
            )
        return out
