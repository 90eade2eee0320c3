"""KV-cached decoding and teacher-forced replay for the vision-language bundle.

The same per-step sampling as ``decode`` (``record_step``: one uniform per row and step, the
tempered unfiltered log-prob recorded), with a multimodal prefill: the prompt's forward takes the
images (``pixel_values`` + ``image_grid_thw``, or cached features as ``mm_encoder_outputs``) and
explicit 3-D mRoPE positions; each generated token is then a plain text token at position
``len_b + t + rope_delta_b`` on all three rotary axes. Replay packs prompt + response like
``replay.pack_for_replay`` and takes its positions from the same ``VLMBundle.rope_positions``, so
the response tokens see exactly the decode's positions and image features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers.modeling_outputs import BaseModelOutputWithPooling

from unirl.rollout.ar.decode import (
    DecodeOutput,
    DecodeState,
    cache_kwarg,
    left_pad,
    record_step,
    stop_tensors,
)
from unirl.rollout.ar.replay import pack_for_replay, tempered_entropy
from unirl.rollout.ar.sampling import token_logprobs
from unirl.rollout.ar.vlm_bundle import VLMBundle


@dataclass
class VisionInputs:
    """A batch's images, in row order: cached features ``image_embeds [tokens, H]`` or the
    processor's ``pixel_values [patches, D]``; ``grid_thw [images, 3]`` either way."""

    grid_thw: Tensor
    image_embeds: Tensor | None = None
    pixel_values: Tensor | None = None

    def forward_kwargs(self, device: torch.device) -> dict[str, Any]:
        """What the model's forward takes for them (features skip the vision tower)."""
        if self.image_embeds is not None:
            out = BaseModelOutputWithPooling(pooler_output=(self.image_embeds.to(device),))  # type: ignore[arg-type]
            return {"mm_encoder_outputs": {"image": out}}
        if self.pixel_values is None:
            raise ValueError("VisionInputs needs image_embeds or pixel_values")
        return {"pixel_values": self.pixel_values.to(device), "image_grid_thw": self.grid_thw.to(device)}


@torch.no_grad()
def decode_multimodal(
    bundle: VLMBundle,
    prompts: Sequence[Sequence[int]],
    vision: VisionInputs,
    *,
    uniforms_BN: Tensor,
    limits: Sequence[int],
    temperature: float,
    top_k: int,
    top_p: float,
    stop_token_ids: Sequence[int],
    pad_token_id: int,
) -> tuple[DecodeOutput, list[Tensor] | None]:
    """Sample up to ``limits[b]`` tokens per prompt; stops when every row has finished.

    Returns the decode output and, when the prefill ran the vision tower, its features (one
    ``[tokens, H]`` tensor per image, in order) so the caller can cache them.
    """
    from transformers import DynamicCache

    model = bundle.model
    device = bundle.device
    B, N = len(prompts), max(limits)
    ids_BP, mask_BP = left_pad(prompts, pad_token_id, device)
    P = ids_BP.shape[1]
    pos_3BP, delta_B = bundle.rope_positions(ids_BP, mask_BP, vision.grid_thw)
    attn_BL = torch.ones((B, P + N), dtype=torch.long, device=device)
    attn_BL[:, :P] = mask_BP
    next_pos_B = mask_BP.sum(-1) + delta_B  # the mRoPE index of the first response token
    u_BN = uniforms_BN.to(device)
    limits_B, stop_ids, pad = stop_tensors(limits, stop_token_ids, pad_token_id, device)
    st = DecodeState(B, N, device, pad_token_id)
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    kw = cache_kwarg(model)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids_BP, attention_mask=mask_BP, position_ids=pos_3BP, use_cache=True, logits_to_keep=1,
        **vision.forward_kwargs(device), **{kw: cache},
    )  # fmt: skip
    image_outputs = getattr(out, "image_outputs", None)
    features = list(image_outputs.pooler_output) if vision.image_embeds is None and image_outputs else None
    steps = 0
    for t in range(N):
        st.t.fill_(t)
        record_step(st, out.logits[:, -1], u_BN, limits_B, stop_ids, pad, **sample)
        steps = t + 1
        if steps == N or bool(st.finished_B.all()):
            break
        pos_3B1 = (next_pos_B + t).view(1, B, 1).expand(3, B, 1)
        out = model(
            input_ids=st.tok_B1, attention_mask=attn_BL[:, : P + steps], position_ids=pos_3B1, use_cache=True,
            **{kw: cache},
        )  # fmt: skip
    return st.output(steps), features


def replay_multimodal_logprobs(
    bundle: VLMBundle,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    vision: VisionInputs,
    temperatures: Sequence[float],
    *,
    with_entropy: bool = False,
    model: torch.nn.Module | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``(logp [B, T], entropy [B, T] or None)`` of the stored responses, fp32, under the caller's
    grad mode (from pixels, gradients reach the vision tower). 0 past a row's end."""
    device = bundle.device
    T = max(len(r) for r in responses)
    if T == 0:
        empty = torch.zeros((len(prompts), 0), dtype=torch.float32, device=device)
        return empty, (empty.clone() if with_entropy else None)
    ids, attn, _, resp_BT = pack_for_replay(prompts, responses, bundle.pad_token_id, device)
    pos_3BL, _ = bundle.rope_positions(ids, attn, vision.grid_thw)
    out = (model or bundle.model)(
        input_ids=ids, attention_mask=attn, position_ids=pos_3BL, use_cache=False, logits_to_keep=T + 1,
        **vision.forward_kwargs(device),
    )  # fmt: skip
    temp_B11 = torch.tensor(list(temperatures), dtype=torch.float32, device=device).view(-1, 1, 1)
    lengths_B = torch.tensor([len(r) for r in responses], device=device)
    pad_BT = torch.arange(T, device=device)[None, :] >= lengths_B[:, None]
    logits_BTV = out.logits[:, :-1]
    logp_BT = token_logprobs(logits_BTV, temp_B11, resp_BT).masked_fill(pad_BT, 0.0)
    if not with_entropy:
        return logp_BT, None
    return logp_BT, tempered_entropy(logits_BTV, temp_B11).masked_fill(pad_BT, 0.0)
