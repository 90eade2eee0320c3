"""``VLMPipeline``: image-conditioned text generation and replay with a vision-language model.

The Pipeline protocol of ``ARPipeline`` (``stage``, ``model``, ``generate(samples, rollout_step=)``,
``replay_logprobs(parts)``), for Samples whose inputs hold a text prompt and uint8 images
(``ImagePrimitive``). Rollout encodes each prompt once (chat template, image processor, image-pad
expansion) and caches on the Part's ``conditions``:
- ``image_grid_thw [images, 3]`` always;
- ``image_embeds [tokens, hidden]`` when the vision tower is frozen: the features the decode's
  prefill computed, reused by every replay;
- ``pixel_values [patches, D]`` otherwise: replay runs the (trained) tower again on them, the
  same computation as the prefill's, now with gradients.

Sampling, seeds and the log-prob convention are ``ARPipeline``'s (see ``unirl.rollout.ar.pipeline``),
so the first-update ratio is 1 up to fp32 round-off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from unirl.rollout.ar.replay import TokenReplay
from unirl.rollout.ar.sampling import derive_seed, draw_uniforms
from unirl.rollout.ar.segments import ar_params, fill_text_part, loss_mask, text_segment
from unirl.rollout.ar.stopping import cut_at_stop_string
from unirl.rollout.ar.vlm_bundle import VLMBundle
from unirl.rollout.ar.vlm_decode import VisionInputs, decode_multimodal, replay_multimodal_logprobs
from unirl.types import ARSamplingParams, Conditions, ImagePrimitive, Part, Sample, to_torch

_Job = tuple[Sample, Part, list[int]]


class VLMPipeline:
    """Fills the text Part ``stage`` of each Sample from its prompt and images.

    Args: as ``ARPipeline`` (``bundle``, ``params``, ``stage``, ``prompt_template``,
    ``stop_at_eos``, ``max_batch_size``); the decoder is the dynamic KV-cache loop.
    """

    def __init__(
        self,
        bundle: VLMBundle,
        params: ARSamplingParams,
        *,
        stage: str = "ar",
        prompt_template: str = "{prompt}",
        stop_at_eos: bool = True,
        max_batch_size: int | None = None,
    ) -> None:
        if "{prompt}" not in prompt_template:
            raise ValueError(f"prompt_template={prompt_template!r} must contain '{{prompt}}'")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1 (or None for no limit)")
        self.bundle = bundle
        self.params = params
        self.stage = stage
        self.prompt_template = prompt_template
        self.stop_at_eos = stop_at_eos
        self.max_batch_size = max_batch_size
        self.replay_model: nn.Module | None = None

    @property
    def model(self) -> nn.Module:
        return self.bundle.model

    def effective_params(self, params: ARSamplingParams) -> ARSamplingParams:
        """``params`` with the EOS ids added to ``stop_token_ids`` when ``stop_at_eos``."""
        if not self.stop_at_eos:
            return params
        ids = list(dict.fromkeys([*params.stop_token_ids, *self.bundle.eos_token_ids]))
        return params if ids == params.stop_token_ids else params.model_copy(update={"stop_token_ids": ids})

    # ---- prompts -------------------------------------------------------------------------------
    def prepare_prompt(self, sample: Sample, part: Part) -> list[int]:
        """Encode ``sample``'s prompt and images, cache the image conditions on ``part``; the ids."""
        images = [to_torch(x.pixels).numpy() for x in sample.inputs if isinstance(x, ImagePrimitive)]
        if not images:
            raise ValueError(
                f"sample {sample.id!r} has no image input; a VLM prompt needs one (ImagePrimitive)"
            )
        text = self.prompt_template.format(prompt=sample.prompt)
        ids, pixels, grid = self.bundle.encode_multimodal(text, [np.asarray(i) for i in images])
        ctx = self.bundle.context_window
        if len(ids) >= ctx:
            raise ValueError(
                f"sample {sample.id!r}: prompt is {len(ids)} tokens (images included) but the context "
                f"window is {ctx}; use smaller images or a shorter prompt"
            )
        part.conditions = Conditions(tensors={"image_grid_thw": grid, "pixel_values": pixels})  # type: ignore[dict-item]
        return ids

    def image_inputs(self, parts: Sequence[Part]) -> VisionInputs:
        """The images of ``parts`` in order: their cached features when every part has them
        (a frozen tower's rollout), else their pixels (the forward runs the vision tower)."""
        conds = []
        for p in parts:
            if p.conditions is None or "image_grid_thw" not in p.conditions.tensors:
                raise ValueError(
                    f"part {p.name!r} has no image conditions; it was not prepared by a VLMPipeline"
                )
            conds.append(p.conditions.tensors)
        grid = torch.cat([to_torch(c["image_grid_thw"]).long() for c in conds])
        if all("image_embeds" in c for c in conds):
            return VisionInputs(grid, image_embeds=torch.cat([to_torch(c["image_embeds"]) for c in conds]))
        if all("pixel_values" in c for c in conds):
            return VisionInputs(
                grid, pixel_values=torch.cat([to_torch(c["pixel_values"]).float() for c in conds])
            )
        raise ValueError("a micro-batch mixes parts with cached image features and parts with pixels only")

    # ---- generation ----------------------------------------------------------------------------
    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        groups: dict[str, tuple[ARSamplingParams, list[_Job]]] = {}
        for s in samples:
            part = s.ensure_part(self.stage)
            params = self.effective_params(ar_params(part, self.params))
            groups.setdefault(params.model_dump_json(), (params, []))[1].append(
                (s, part, self.prepare_prompt(s, part))
            )
        model = self.bundle.model
        was_training = model.training
        model.eval()
        try:
            for params, jobs in groups.values():
                step = self.max_batch_size or len(jobs)
                for i in range(0, len(jobs), step):
                    self._generate_batch(jobs[i : i + step], params, rollout_step)
        finally:
            model.train(was_training)
        return samples

    def _generate_batch(self, jobs: Sequence[_Job], params: ARSamplingParams, rollout_step: int) -> None:
        ctx = self.bundle.context_window
        prompts = [ids for _, _, ids in jobs]
        limits = [min(params.max_new_tokens, ctx - len(ids)) for ids in prompts]
        seeds = [derive_seed(params.seed, rollout_step, s.id) for s, _, _ in jobs]
        vision = self.image_inputs([p for _, p, _ in jobs])
        out, features = decode_multimodal(
            self.bundle, prompts, vision, uniforms_BN=draw_uniforms(seeds, max(limits)), limits=limits,
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
            stop_token_ids=params.stop_token_ids, pad_token_id=self.bundle.pad_token_id,
        )  # fmt: skip
        if self.bundle.freeze_vision and features is not None:
            self._cache_features([p for _, p, _ in jobs], features)
        stops = [x for x in params.stop if x]
        for b, (_, part, prompt_ids) in enumerate(jobs):
            n = int(out.lengths[b])
            response = out.tokens[b, :n].tolist()
            stopped = bool(out.stopped[b])
            cut = cut_at_stop_string(response, self.bundle.decode, stops) if stops else None
            if cut is not None:
                n, text = cut
                response, stopped = response[:n], True
            else:
                text = self.bundle.decode(response)
            finish: Literal["stop", "length"] = "stop" if stopped else "length"
            fill_text_part(
                part, prompt_ids=prompt_ids, response_ids=response, log_probs=out.logprobs[b, :n].clone(),
                text=text, finish=finish, params=params,
            )  # fmt: skip

    @staticmethod
    def _cache_features(parts: Sequence[Part], features: Sequence[Tensor]) -> None:
        """Keep a frozen tower's per-image features on each Part in place of its pixels."""
        it = iter(features)
        for p in parts:
            tensors = p.conditions.tensors  # type: ignore[union-attr]  # prepare_prompt set them
            n = int(to_torch(tensors["image_grid_thw"]).shape[0])
            embeds = torch.cat([next(it) for _ in range(n)]).detach().float().cpu()
            p.conditions = Conditions(
                tensors={"image_grid_thw": tensors["image_grid_thw"], "image_embeds": embeds}
            )

    # ---- replay --------------------------------------------------------------------------------
    def replay_logprobs(self, parts: Sequence[Part], *, with_entropy: bool = False) -> TokenReplay:
        """Teacher-forced log-probs ``[B, T]`` of the stored responses given prompt and images."""
        segs = [text_segment(p) for p in parts]
        logp, entropy = replay_multimodal_logprobs(
            self.bundle, [s.prompt_ids for s in segs], [s.response_ids for s in segs], self.image_inputs(parts),
            [ar_params(p, self.params).temperature for p in parts], with_entropy=with_entropy,
            model=self.replay_model,
        )  # fmt: skip
        return TokenReplay(logp=logp, mask=loss_mask(parts, device=logp.device), entropy=entropy)
