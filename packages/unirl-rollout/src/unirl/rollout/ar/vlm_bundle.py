"""The vision-language bundle: a Qwen2.5-VL ``ForConditionalGeneration`` model, its tokenizer and
its image processor, for image-conditioned RL on text answers.

What a prompt becomes (the work ``Qwen2_5_VLProcessor`` does, done here so that no video
processor, hence no torchvision, is needed):
1. the chat template renders ``[{"type": "image"}, {"type": "text", ...}]`` as
   ``<|vision_start|><|image_pad|><|vision_end|>question``;
2. the image processor turns the uint8 image into ``pixel_values [patches, C*t*p*p]`` and
   ``image_grid_thw [1, 3]``;
3. the single ``<|image_pad|>`` is expanded to ``prod(grid_thw) / merge_size**2`` copies, one per
   vision feature the merger emits.

Every forward goes through the model's own ``forward`` (it runs the vision tower, or takes
cached features as ``mm_encoder_outputs``, and scatters them over the image pads), so a train
backend's hooks (FSDP2 gathering, LoRA) see every call; the explicit 3-D mRoPE positions come
from ``rope_positions`` for decode's prefill and the replay alike. ``freeze_vision=True`` keeps the vision tower out of training: its features are
computed once at rollout and cached on the Part; otherwise replay recomputes them from the
cached ``pixel_values`` with gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from unirl.rollout.ar.bundle import CausalLMBundle, resolve_dtype

IMAGE_PAD = "<|image_pad|>"
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", IMAGE_PAD, "<|video_pad|>")

# Qwen2-VL's ChatML with image parts (tool calls and video trimmed).
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class VLMBundle(CausalLMBundle):
    """A Qwen2.5-VL model + tokenizer + image processor, as rollout and training see them.

    ``model`` is the trainable module (the whole model; with ``freeze_vision`` its vision tower
    has ``requires_grad=False`` and is listed in ``frozen_modules``).
    """

    image_processor: Any = None
    freeze_vision: bool = False

    def __post_init__(self) -> None:
        if self.image_processor is None:
            raise ValueError("VLMBundle needs an image_processor (the checkpoint's preprocessor_config.json)")
        if self.freeze_vision:
            self.visual.requires_grad_(False)

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(  # type: ignore[override]  # a VLM has no GGUF / pkg: paths
        cls,
        path_or_id: str | Path,
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        attn_implementation: str | None = None,
        tokenizer_path: str | Path | None = None,
        use_chat_template: bool = True,
        system_prompt: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        freeze_vision: bool = False,
        family: str | None = "qwen2_5_vl",
    ) -> VLMBundle:
        """Model, tokenizer and image processor from a local directory or hub id (errors as for
        ``CausalLMBundle.from_pretrained``, plus a missing ``preprocessor_config.json``)."""
        from unirl.rollout.ar.families import MODEL_TYPES, _looks_local, check_checkpoint_dir

        check_checkpoint_dir(path_or_id, family=family, tokenizer_path=tokenizer_path)
        if (
            _looks_local(str(path_or_id))
            and not (Path(str(path_or_id)) / "preprocessor_config.json").is_file()
        ):
            raise FileNotFoundError(
                f"model.path={str(path_or_id)!r} has no preprocessor_config.json (the image processor); "
                "save it there with image_processor.save_pretrained"
            )
        kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype)}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        model = AutoModelForImageTextToText.from_pretrained(str(path_or_id), **kwargs).to(device)  # type: ignore[arg-type]
        if family is not None and model.config.model_type != MODEL_TYPES[family]:
            raise ValueError(
                f"model.path={str(path_or_id)!r} loaded a {model.config.model_type!r} model but "
                f"model.family={family!r} expects {MODEL_TYPES[family]!r}"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path or path_or_id))
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return cls(
            model,
            tokenizer,
            use_chat_template=use_chat_template,
            system_prompt=system_prompt,
            chat_template_kwargs=dict(chat_template_kwargs or {}),
            image_processor=AutoImageProcessor.from_pretrained(str(path_or_id)),
            freeze_vision=freeze_vision,
        )

    @classmethod
    def tiny_qwen2_5_vl(
        cls,
        tokenizer: Any,
        *,
        image_size: int = 32,
        patch_size: int = 8,
        hidden_size: int = 32,
        num_layers: int = 2,
        num_heads: int = 4,
        num_kv_heads: int = 2,
        intermediate_size: int = 64,
        vision_hidden_size: int = 32,
        vision_depth: int = 1,
        vision_heads: int = 2,
        max_position_embeddings: int = 256,
        freeze_vision: bool = False,
        seed: int = 0,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
    ) -> VLMBundle:
        """A randomly initialised tiny Qwen2.5-VL over ``tokenizer`` (which must hold the vision
        tokens, e.g. ``train_bpe_tokenizer(..., extra_special_tokens=VISION_TOKENS)``); images are
        resized to ``image_size`` squared, ``(image_size / patch_size / 2)**2`` features each."""
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        missing = [t for t in VISION_TOKENS if t not in tokenizer.get_vocab()]
        if missing:
            raise ValueError(f"the tokenizer lacks the vision tokens {missing}; add them as special tokens")
        if hidden_size % num_heads or (hidden_size // num_heads) % 4:
            raise ValueError(
                f"hidden_size={hidden_size} / num_heads={num_heads} must be a head_dim divisible by 4 (mRoPE)"
            )
        if image_size % (2 * patch_size):
            raise ValueError(f"image_size={image_size} must be a multiple of 2 * patch_size={2 * patch_size}")
        half = hidden_size // num_heads // 2  # rotary frequencies per head, split over (t, h, w)
        section = [half - 2 * (half // 4), half // 4, half // 4]
        ids = tokenizer.convert_tokens_to_ids
        config = Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                max_position_embeddings=max_position_embeddings,
                rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": 10000.0},
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
            ),
            vision_config=dict(
                depth=vision_depth, hidden_size=vision_hidden_size, intermediate_size=2 * vision_hidden_size,
                num_heads=vision_heads, patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2,
                out_hidden_size=hidden_size, window_size=image_size, fullatt_block_indexes=[vision_depth - 1],
            ),
            image_token_id=ids(IMAGE_PAD), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
            tie_word_embeddings=True,
        )  # fmt: skip
        pixels = image_size * image_size
        processor = Qwen2VLImageProcessorPil(
            patch_size=patch_size, temporal_patch_size=2, merge_size=2, min_pixels=pixels, max_pixels=pixels,
            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        )  # fmt: skip
        if tokenizer.chat_template is None:
            tokenizer.chat_template = VLM_CHAT_TEMPLATE
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2_5_VLForConditionalGeneration(config)
        model.generation_config.eos_token_id = [int(tokenizer.eos_token_id)]
        model = model.to(device=device, dtype=resolve_dtype(dtype))  # type: ignore[call-arg]
        return cls(model, tokenizer, image_processor=processor, freeze_vision=freeze_vision)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Model, tokenizer (with its chat template) and ``preprocessor_config.json``."""
        directory = super().save_pretrained(directory)
        self.image_processor.save_pretrained(directory)
        return directory

    # ---- modules -------------------------------------------------------------------------
    @property
    def visual(self) -> nn.Module:
        return self.model.model.visual  # type: ignore[return-value]

    def frozen_modules(self) -> dict[str, nn.Module]:
        """The vision tower when ``freeze_vision`` (its features are cached at rollout)."""
        return {"visual": self.visual} if self.freeze_vision else {}

    @property
    def merge_length(self) -> int:
        return int(self.model.config.vision_config.spatial_merge_size) ** 2

    @property
    def image_token_id(self) -> int:
        return int(self.model.config.image_token_id)

    # ---- prompts -------------------------------------------------------------------------
    def render_prompt(self, text: str, num_images: int = 0) -> str:  # type: ignore[override]
        """The chat-templated prompt with ``num_images`` image placeholders before the text."""
        if not self.has_chat_template:
            raise ValueError("a VLM prompt needs a chat template (it places the image tokens); set one")
        content: list[dict[str, str]] = [{"type": "image"} for _ in range(num_images)]
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [*content, {"type": "text", "text": text}]}
        ]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return str(
            self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        )

    def encode_multimodal(self, text: str, images: Sequence[np.ndarray]) -> tuple[list[int], Tensor, Tensor]:
        """``(prompt ids with expanded image pads, pixel_values [patches, D], image_grid_thw [n, 3])``."""
        if not images:
            raise ValueError(f"prompt {text!r} has no image; a VLM prompt needs at least one")
        vis = self.image_processor(images=[np.asarray(i)[..., :3] for i in images], return_tensors="pt")
        grid = vis["image_grid_thw"].long()
        pieces = self.render_prompt(text, len(images)).split(IMAGE_PAD)
        if len(pieces) != len(images) + 1:
            raise ValueError(f"the chat template wrote {len(pieces) - 1} image pads for {len(images)} images")
        rendered = pieces[0]
        for g, piece in zip(grid, pieces[1:]):
            rendered += IMAGE_PAD * (int(g.prod()) // self.merge_length) + piece
        ids = list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        return ids, vis["pixel_values"].float(), grid

    def encode_prompt(self, text: str) -> list[int]:
        raise TypeError("a VLM prompt carries images: use encode_multimodal(text, images)")

    # ---- the language model's inputs -----------------------------------------------------------
    def rope_positions(self, ids_BL: Tensor, attn_BL: Tensor, grid_thw: Tensor) -> tuple[Tensor, Tensor]:
        """``(position_ids [3, B, L], rope_delta [B])``: Qwen2.5-VL's mRoPE indices of a batch
        whose image pads, in row order, belong to the images of ``grid_thw [images, 3]``.

        Padding gets index 0. ``rope_delta`` is what a later text token adds to its 1-D index: the
        ``t``-th generated token of row ``b`` sits at ``len_b + t + rope_delta_b`` on all three
        axes. (Config arithmetic only: no parameter is read, so it runs outside the forward.)
        """
        mask_BL = ids_BL == self.image_token_id
        pos_3BL, delta_B1 = self.model.model.get_rope_index(
            ids_BL,
            mm_token_type_ids=mask_BL.int(),
            image_grid_thw=grid_thw.to(ids_BL.device),
            attention_mask=attn_BL,
        )
        return pos_3BL, delta_B1.view(-1).to(ids_BL.device)
