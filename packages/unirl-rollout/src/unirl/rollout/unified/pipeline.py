"""The two tracks of a ``UnifiedBundle``: think (text) then draw (image), each with its replay.

``UnifiedTextPipeline`` samples the plan token by token with the text head and records one
log-prob per token (``log_softmax(logits / temperature)``, unfiltered: the convention of
``unirl.rollout.ar.sampling``); ``replay_logprobs`` re-scores the stored plan teacher-forced.
``UnifiedImagePipeline`` is ``FlowMatchPipeline`` (same SDE kernels, pinned sigmas, stored
transitions, ``replay_step``) over the image head, conditioned on the text Part's exact tokens
(prompt + plan) rather than on re-encoded text.

Every text forward, at sampling and at replay, is padded to the bundle's ``max_text_len``: the
kernels then see one shape, and a causal row never depends on the padding after it, so the
first-update ratio is exactly 1 in fp32 on both tracks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from unirl.rollout.ar.replay import TokenReplay
from unirl.rollout.ar.sampling import derive_seed, draw_uniforms, sample_next_token, token_logprobs
from unirl.rollout.pipelines.flow import FlowMatchPipeline
from unirl.rollout.schedules import DynamicShiftSchedule
from unirl.rollout.unified.bundle import UnifiedBundle
from unirl.types import (
    ARSamplingParams,
    Conditions,
    DiffusionSamplingParams,
    Part,
    Sample,
    TextPrimitive,
    TextSegment,
)

__all__ = ["ImageHeadView", "UnifiedImagePipeline", "UnifiedTextPipeline", "pad_text"]


def pad_text(
    rows: Sequence[Sequence[int]], width: int, pad: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Right-padded ``(ids [B, width] long, mask [B, width] bool)``."""
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"text of {len(r)} tokens does not fit max_text_len={width}")
        ids[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[b, : len(r)] = True
    return ids.to(device), mask.to(device)


class UnifiedTextPipeline:
    """Samples the ``stage`` text Part (the plan) of each Sample from its prompt; replays it."""

    def __init__(
        self, bundle: UnifiedBundle, *, stage: str = "ar", default_params: ARSamplingParams | None = None
    ) -> None:
        self.bundle, self.stage, self.default_params = bundle, stage, default_params

    @torch.no_grad()
    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        groups: dict[str, list[tuple[Sample, Part, ARSamplingParams]]] = {}
        for s in samples:
            part = s.ensure_part(self.stage)
            params = part.sampling_params if part.sampling_params is not None else self.default_params
            if not isinstance(params, ARSamplingParams):
                raise TypeError(
                    f"sample {s.id!r} part {self.stage!r}: sampling_params must be ARSamplingParams "
                    f"(set it on the Part or pass default_params=); got {type(params).__name__}"
                )
            groups.setdefault(params.model_dump_json(), []).append((s, part, params))
        for members in groups.values():
            self._generate_batch(members, rollout_step)
        return samples

    def _generate_batch(
        self, members: list[tuple[Sample, Part, ARSamplingParams]], rollout_step: int
    ) -> None:
        b, params = self.bundle, members[0][2]
        W, dev = b.max_text_len, b.device
        prompts = [b.encode_prompt(s.prompt) for s, _, _ in members]
        steps = min(params.max_new_tokens, W - max(len(p) for p in prompts))
        if steps < 1:
            raise ValueError(f"prompts of up to {max(len(p) for p in prompts)} tokens leave no room in {W}")
        u_BS = draw_uniforms(
            [derive_seed(params.seed, rollout_step, s.id) for s, _, _ in members], steps, dev
        )
        resp: list[list[int]] = [[] for _ in members]
        logps: list[list[float]] = [[] for _ in members]
        done = [False] * len(members)
        for t in range(steps):
            live = [i for i, d in enumerate(done) if not d]
            if not live:
                break
            ids, mask = pad_text([prompts[i] + resp[i] for i in live], W, b.pad_token_id, dev)
            last = torch.tensor([len(prompts[i]) + len(resp[i]) - 1 for i in live], device=dev)
            logits_BV = b.text_logits(ids, mask)[torch.arange(len(live), device=dev), last]
            tok, lp = sample_next_token(
                logits_BV,
                u_BS[live, t],
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
            )
            for j, i in enumerate(live):
                resp[i].append(int(tok[j]))
                logps[i].append(float(lp[j]))
                done[i] = resp[i][-1] == b.eos_token_id
        for i, (_, part, _) in enumerate(members):
            stopped = done[i]
            part.sampling_params = params
            part.segment = TextSegment(
                prompt_ids=prompts[i],
                response_ids=resp[i],
                log_probs=torch.tensor(logps[i], dtype=torch.float32),
                finish_reason="stop" if stopped else "length",
            )
            part.outputs = [TextPrimitive(text=b.decode(resp[i]))]
            part.status = "completed" if stopped else "truncated"

    def replay_logprobs(self, parts: Sequence[Part]) -> TokenReplay:
        """Teacher-forced log-probs ``[B, T]`` of each Part's response tokens, with gradients."""
        b = self.bundle
        segs = []
        for p in parts:
            if not isinstance(p.segment, TextSegment) or not isinstance(p.sampling_params, ARSamplingParams):
                raise TypeError(f"part {p.name!r} needs a TextSegment and ARSamplingParams to replay")
            segs.append(p.segment)
        dev = b.device
        ids, mask = pad_text(
            [s.prompt_ids + s.response_ids for s in segs], b.max_text_len, b.pad_token_id, dev
        )
        T = max(len(s.response_ids) for s in segs)
        logits = b.text_logits(ids, mask)
        rows, cols, out_mask = [], [], torch.zeros((len(segs), T), dtype=torch.bool, device=dev)
        targets = torch.zeros((len(segs), T), dtype=torch.long, device=dev)
        for i, s in enumerate(segs):
            n, P = len(s.response_ids), len(s.prompt_ids)
            rows += [i] * T
            cols += [min(P - 1 + t, b.max_text_len - 1) for t in range(T)]
            out_mask[i, :n] = True
            targets[i, :n] = torch.tensor(s.response_ids, dtype=torch.long)
        temps = [float(p.sampling_params.temperature) for p in parts]  # type: ignore[union-attr]
        temp_B1 = torch.tensor(temps, dtype=torch.float32, device=dev).repeat_interleave(T).view(-1, 1)
        picked = logits[torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)]  # [B*T, V]
        logp = token_logprobs(picked, temp_B1, targets.view(-1)).view(len(segs), T)
        return TokenReplay(logp=logp.masked_fill(~out_mask, 0.0), mask=out_mask)


class ImageHeadView:
    """A ``UnifiedBundle`` seen as a ``FlowBundle`` (``decode`` = latents -> images)."""

    embedded_guidance = False

    def __init__(self, bundle: UnifiedBundle) -> None:
        self.unified = bundle
        self.transformer: nn.Module = bundle.model
        self.dynamic_schedule: DynamicShiftSchedule = bundle.dynamic_schedule

    @property
    def device(self) -> torch.device:
        return self.unified.device

    @property
    def dtype(self) -> torch.dtype:
        return self.unified.dtype

    def frozen_modules(self) -> dict[str, nn.Module]:
        return self.unified.frozen_modules()

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        return self.unified.latent_shape(height, width)

    def image_seq_len(self, height: int, width: int) -> int:
        return self.unified.image_seq_len(height, width)

    def encode_prompts(self, texts: Sequence[str]) -> list[Conditions]:
        raise TypeError(
            "the unified image head is conditioned on the text Part's tokens, not on re-encoded text"
        )

    def predict_velocity(self, latents: Tensor, sigma: Tensor, conditions: dict[str, Tensor]) -> Tensor:
        return self.unified.predict_velocity(latents, sigma, conditions)

    def decode(self, latents: Tensor) -> Tensor:
        return self.unified.decode_latents(latents)


class UnifiedImagePipeline(FlowMatchPipeline):
    """``FlowMatchPipeline`` over the image head, conditioned on the ``text_part``'s prompt + plan tokens."""

    def __init__(
        self,
        bundle: UnifiedBundle,
        *,
        stage: str = "image",
        text_part: str = "ar",
        default_params: DiffusionSamplingParams | None = None,
        record_old_means: bool = False,
    ) -> None:
        super().__init__(
            ImageHeadView(bundle),  # type: ignore[arg-type]  # a FlowBundle by structure
            stage=stage,
            default_params=default_params,
            prompt_part=text_part,
            record_old_means=record_old_means,
        )
        self.unified = bundle

    def _encode(
        self, members: list[tuple[Sample, Part, DiffusionSamplingParams]], params: DiffusionSamplingParams
    ) -> list[Conditions]:
        if params.cfg:
            raise ValueError(
                f"guidance_scale={params.guidance_scale}: the unified image head samples without CFG "
                "(no unconditional text context is defined); set guidance_scale: 1.0"
            )
        out = []
        for s, _, _ in members:
            seg = s.part(str(self.prompt_part)).segment
            if not isinstance(seg, TextSegment):
                raise ValueError(
                    f"sample {s.id!r}: part {self.prompt_part!r} has no TextSegment; the text track must "
                    "run before the image track"
                )
            out.append(self.unified.context_conditions(seg.prompt_ids, seg.response_ids))
        return out
