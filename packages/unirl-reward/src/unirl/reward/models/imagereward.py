"""ImageReward (Xu et al. 2023) on transformers' BLIP: text encoder cross-attending to the image,
an MLP head on the [CLS] state, then the authors' normalisation.

The `image-reward` PyPI package pins old timm/fairscale and downloads its checkpoint and
BLIP config from the hub at run time, so it is unusable offline. This module runs the same
architecture with `BlipForImageTextRetrieval` (vision_model + text_encoder, as in the
authors' `ImageReward.score`) and the same head and normalisation:
    reward = (mlp(text_encoder(prompt, image)[:, 0]) - 0.16717362830052426) / 1.0333394966054072
A model folder holds the BLIP weights (from_pretrained layout), `mlp.safetensors` (the head,
`layers.*` keys) and the BLIP processor.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unirl.reward.models._extras import require
from unirl.reward.models._torch import chunks, model_device_dtype, torch_dtype
from unirl.reward.models.mlp_head import load_head
from unirl.reward.protocol import Modality, ScoreItem, ScoreResult, check_inputs

MEAN, STD = 0.16717362830052426, 1.0333394966054072
MAX_PROMPT_TOKENS = 35  # the authors' tokenizer max_length


class ImageRewardScorer:
    modality: Modality = "image+text"
    output_range = (float("-inf"), float("inf"))
    name = "imagereward"

    def __init__(self, blip: Any, head: Any, processor: Any, batch_size: int = 8, version: str = "1") -> None:
        width = int(blip.config.text_config.hidden_size)
        if head.input_dim != width:
            raise ValueError(
                f"ImageReward head expects {head.input_dim}-d input but BLIP text width is {width}"
            )
        device, dtype = model_device_dtype(blip)
        self.blip, self.head = blip.eval(), head.to(device, dtype).eval()
        self.processor, self.batch_size, self.version = processor, batch_size, version

    @classmethod
    def from_pretrained(
        cls, model_path: str, device: str = "cpu", dtype: str = "float32", batch_size: int = 8
    ) -> ImageRewardScorer:
        tf = require("imagereward", "transformers")
        blip = tf.BlipForImageTextRetrieval.from_pretrained(
            model_path, local_files_only=True, dtype=torch_dtype(dtype)
        )
        proc = tf.BlipProcessor.from_pretrained(model_path, local_files_only=True)
        head = load_head(str(Path(model_path) / "mlp.safetensors"))
        return cls(blip.to(device), head, proc, batch_size, version=f"1+{Path(model_path).name}+{dtype}")

    def rewards(self, images: Sequence[Any], prompts: Sequence[str]) -> list[float]:
        import torch

        device, dtype = model_device_dtype(self.blip)
        out: list[float] = []
        with torch.inference_mode():
            for idx in chunks(range(len(images)), self.batch_size):
                ims, txt = [images[i] for i in idx], [prompts[i] for i in idx]
                pix = self.processor(images=ims, return_tensors="pt")["pixel_values"].to(device, dtype)
                enc = self.processor(
                    text=txt,
                    padding="max_length",
                    truncation=True,
                    max_length=MAX_PROMPT_TOKENS,
                    return_tensors="pt",
                ).to(device)
                image_embeds_BLD = self.blip.vision_model(pixel_values=pix).last_hidden_state
                image_atts = torch.ones(image_embeds_BLD.shape[:-1], dtype=torch.long, device=device)
                text_BTD = self.blip.text_encoder(
                    input_ids=enc["input_ids"],
                    attention_mask=enc["attention_mask"],
                    encoder_hidden_states=image_embeds_BLD,
                    encoder_attention_mask=image_atts,
                ).last_hidden_state
                raw = self.head(text_BTD[:, 0, :]).squeeze(-1).float()
                out.extend(((raw - MEAN) / STD).tolist())
        return out

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreResult]:
        check_inputs(self.name, self.modality, items)
        if not items:
            return []
        vals = self.rewards([it.image for it in items], [it.prompt or "" for it in items])
        return [ScoreResult(total=float(v)) for v in vals]
