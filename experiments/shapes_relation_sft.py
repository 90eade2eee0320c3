"""Which tiny-model change lets SFT learn the shapes world's relations? (docs/experiments/shapes_history.md, issue 6)

    python experiments/shapes_relation_sft.py VARIANT STEPS [DEVICE [SEED]]    # e.g. mix2_pos1_coord_lm2 1500 cuda 0

A self-contained SFT loop (the recipe's world, batch 64, AdamW 1e-3 with 50 warmup steps, grad
clip 1, logit-normal t) over the variants in VARIANTS:
- train_text: the text encoder trains with the U-Net (else frozen); text_pos_std: its position init;
- causal: a CLIP-style causal text encoder, pooled from the last token;
- coord: coordinate planes as extra input channels; mix: N trainable text layers in the U-Net
  (both through the package's TinyUNet options); attn_pos: learned positions on the 4x4 attention
  queries; attn8: a second joint attention at 8x8;
- logit_mean / uniform_t / lr / text_lr_mult / batch: the SFT settings.
Prints a JSON line at fixed steps: loss, held-out and train relation rate over the samples that
show both groups ("rel"), the share that shows both ("both"), accuracy over the relation captions
with the shape check off ("acc"), and the probe (red - blue mean column) for "a red circle left of
a blue square" ("red_first") and "a blue square left of a red circle" ("blue_first"): about -15 and
+15 when the model reads word order, the same value for both when it does not.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

from unirl.apps.worlds.shapes import ShapesWorld, ShapesWorldConfig, images_to_unit, unit_to_images
from unirl.reward.worlds.shapes_checker import CheckerConfig, check_image, colour_masks
from unirl.rollout.models.tiny.pixel_bundle import SHAPES_VOCAB
from unirl.rollout.models.tiny.text_encoder import TinyTextEncoder, WordTokenizer
from unirl.rollout.models.tiny.unet import JointAttention, TinyUNet, coordinate_planes

VARIANTS = {
    "base": {},
    "tt": {"train_text": True},
    "tt_coord": {"train_text": True, "coord": True},
    "tt_apos": {"train_text": True, "attn_pos": True},
    "tt_coord_apos": {"train_text": True, "coord": True, "attn_pos": True},
    "pos1_coord_apos": {"text_pos_std": 1.0, "coord": True, "attn_pos": True},
    "tt_pos1_coord_apos": {"train_text": True, "text_pos_std": 1.0, "coord": True, "attn_pos": True},
    "tt_coord_apos_a8": {"train_text": True, "coord": True, "attn_pos": True, "attn8": True},
    "tt_coord_unif": {"train_text": True, "coord": True, "uniform_t": True},
    "tt_coord_lr3": {"train_text": True, "coord": True, "lr": 3e-4},
    "c_coord": {"causal": True, "coord": True},
    "c_pos1_coord": {"causal": True, "coord": True, "text_pos_std": 1.0},
    "ct_coord": {"causal": True, "coord": True, "train_text": True},
    "ct_pos1_coord": {"causal": True, "coord": True, "train_text": True, "text_pos_std": 1.0},
    "ct_pos1_coord_apos": {
        "causal": True,
        "coord": True,
        "train_text": True,
        "text_pos_std": 1.0,
        "attn_pos": True,
    },
    "tt_pos1_coord_tlr3": {"train_text": True, "text_pos_std": 1.0, "coord": True, "text_lr_mult": 3.0},
    "tt_pos1_coord_b32": {"train_text": True, "text_pos_std": 1.0, "coord": True, "batch": 32},
    "mix2_pos1_coord": {"mix": 2, "text_pos_std": 1.0, "coord": True},
    "mix1_pos1_coord": {"mix": 1, "text_pos_std": 1.0, "coord": True},
    "mix2_pos3_coord": {"mix": 2, "text_pos_std": 3.0, "coord": True},
    "mix2_pos1_coord_lm2": {"mix": 2, "text_pos_std": 1.0, "coord": True, "logit_mean": 2.0},
    "mix2_pos1_coord_lm2_c16": {
        "mix": 2,
        "text_pos_std": 1.0,
        "coord": True,
        "logit_mean": 2.0,
        "channels": 16,
    },
    "mix2_pos1_coord_lm2_c24": {
        "mix": 2,
        "text_pos_std": 1.0,
        "coord": True,
        "logit_mean": 2.0,
        "channels": 24,
    },
    "tt_pos3_coord": {"train_text": True, "text_pos_std": 3.0, "coord": True},
    "mix2_pos3_coord_lm2": {"mix": 2, "text_pos_std": 3.0, "coord": True, "logit_mean": 2.0},
    "tt_pos1": {"train_text": True, "text_pos_std": 1.0},
    "tt_pos1_coord": {"train_text": True, "text_pos_std": 1.0, "coord": True},
    "tt_pos1_apos": {"train_text": True, "text_pos_std": 1.0, "attn_pos": True},
    "tt_pos03_coord_apos": {"train_text": True, "text_pos_std": 0.3, "coord": True, "attn_pos": True},
    "tt_pos1_coord_apos_lr2": {
        "train_text": True,
        "text_pos_std": 1.0,
        "coord": True,
        "attn_pos": True,
        "lr": 2e-3,
    },
}


class CausalText(TinyTextEncoder):
    """Causal attention (CLIP-style); pooled from the last real token."""

    def forward(self, ids_BL, mask_BL):
        L = ids_BL.shape[1]
        h = self.embed(ids_BL) + self.pos[:, :L]
        causal = torch.triu(torch.ones(L, L, dtype=torch.bool, device=ids_BL.device), 1)
        h = self.norm(self.layers(h, mask=causal, src_key_padding_mask=~mask_BL))
        hidden = self.to_hidden(h) * mask_BL.unsqueeze(-1).to(h.dtype)
        last = mask_BL.long().sum(1) - 1
        return hidden, self.to_pooled(h[torch.arange(len(last), device=h.device), last])


class PosAttention(JointAttention):
    def __init__(self, channels: int, text_dim: int, n_tokens: int) -> None:
        super().__init__(channels, text_dim)
        self.pos = nn.Parameter(torch.randn(1, n_tokens, channels) * 0.5)

    def forward(self, x_BCHW, text_BLD):
        b, c, h, w = x_BCHW.shape
        img = self.norm(x_BCHW).flatten(2).transpose(1, 2) + self.pos
        tokens = torch.cat([img, self.text(text_BLD)], dim=1)
        y, _ = self.attn(img, tokens, tokens, need_weights=False)
        return x_BCHW + self.out(y).transpose(1, 2).reshape(b, c, h, w)


class AttendAfter(nn.Module):
    """`module`, then joint attention over the text tokens of the owner's current forward."""

    def __init__(self, module: nn.Module, attn: nn.Module, owner: nn.Module) -> None:
        super().__init__()
        self.module, self.attn = module, attn
        self._owner = [owner]  # a list: not registered as a submodule (no cycle)

    def forward(self, h):
        return self.attn(self.module(h), self._owner[0]._text)


class Net(nn.Module):
    def __init__(self, v: dict, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.tok = WordTokenizer(SHAPES_VOCAB, max_length=12)
        cls = CausalText if v.get("causal") else TinyTextEncoder
        self.text = cls(self.tok.vocab_size, 12, 64, 2, 4, 64, 64)
        if "text_pos_std" in v:
            nn.init.normal_(self.text.pos, std=v["text_pos_std"])
        if not v.get("train_text"):
            self.text.requires_grad_(False)
        self.coord = bool(v.get("coord")) and "mix" not in v
        self.unet = TinyUNet(5 if self.coord else 3, 32, 64, 64)
        if "mix" in v:  # the package's options: coordinate planes + trainable text layers inside
            self.unet = TinyUNet(
                3, v.get("channels", 32), 64, 64, coord_channels=bool(v.get("coord")), text_layers=v["mix"]
            )
        if self.coord:
            self.unet.conv_out = nn.Conv2d(32, 3, 3, padding=1)
            nn.init.zeros_(self.unet.conv_out.weight)
            nn.init.zeros_(self.unet.conv_out.bias)
        if v.get("attn_pos"):
            self.unet.mid_attn = PosAttention(64, 64, 16)
        if v.get("attn8"):  # joint attention on the 8x8 features (after the second down-sampling)
            self.unet.pool[1] = AttendAfter(self.unet.pool[1], PosAttention(64, 64, 64), self)

    def encode(self, captions):
        ids, mask = self.tok(captions)
        return self.text(ids.to(self.dev), mask.to(self.dev))

    @property
    def dev(self):
        return next(self.unet.parameters()).device

    def forward(self, x, sigma, cond):
        hidden, pooled = cond
        self._text = hidden
        if self.coord:  # the planes outside the U-Net (its own init order, as the sweeps ran)
            x = torch.cat([x, coordinate_planes(x)], dim=1)
        return self.unet(x, hidden, pooled, sigma * 1000.0)[0]


@torch.no_grad()
def sample(net, captions, gen, steps=10):
    dev = net.dev
    x = torch.randn(len(captions), 3, 32, 32, generator=gen).to(dev)
    cond = net.encode(captions)
    sig = torch.linspace(1, 0, steps + 1)
    for j in range(steps):
        v = net(x, torch.full((len(captions),), float(sig[j]), device=dev), cond)
        x = x + float(sig[j + 1] - sig[j]) * v
    return unit_to_images(x.float().cpu().numpy())


def rel_stats(net, world, split, per, gen):
    caps = [c for c in world.captions(split) if " of " in c or "above" in c or "below" in c]
    caps = [c for c in caps for _ in range(per)]
    imgs = []
    for i in range(0, len(caps), 256):
        imgs.append(sample(net, caps[i : i + 256], gen))
    imgs = np.concatenate(imgs)
    cfg = CheckerConfig(check_shape=False)
    rel, both, acc = 0, 0, 0
    for img, cap in zip(imgs, caps):
        r = check_image(img, cap, cfg)
        acc += r.correct
        present = r.components["count_0"] > 0 and r.components["count_1"] > 0
        if present:
            both += 1
            rel += r.components["relation"]
    return {
        f"{split}_rel": rel / max(both, 1),
        f"{split}_both": both / len(caps),
        f"{split}_acc": acc / len(caps),
    }


def probe(net, gen):
    out = {}
    for cap in ("a red circle left of a blue square", "a blue square left of a red circle"):
        imgs = sample(net, [cap] * 64, gen)
        offs = []
        for img in imgs:
            m = colour_masks(img, CheckerConfig())
            if m["red"].any() and m["blue"].any():
                offs.append(np.nonzero(m["red"])[1].mean() - np.nonzero(m["blue"])[1].mean())
        out[cap.split()[1] + "_first"] = round(float(np.mean(offs)), 2) if offs else None
    return out


def main(variant: str, steps: int, device: str = "cpu", seed: int = 0) -> None:
    v = VARIANTS[variant]
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    world = ShapesWorld(ShapesWorldConfig(resolution=32, max_count_pair=1))
    net = Net(v, seed).to(device)
    params = [p for p in net.parameters() if p.requires_grad]
    lr = v.get("lr", 1e-3)
    text_ids = {id(p) for p in net.text.parameters()}
    groups = [
        {"params": [p for p in params if id(p) not in text_ids], "lr": lr},
        {"params": [p for p in params if id(p) in text_ids], "lr": lr * v.get("text_lr_mult", 1.0)},
    ]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=0.0)
    bs = v.get("batch", 64)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 50))
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    evals = {s for s in (150, 300, 450, 600, 800, 1000, 1200, 1500, 2000, 3000, 4000, 6000) if s <= steps} | {
        steps
    }
    t0, losses = time.time(), []
    for step in range(1, steps + 1):
        batch = world.sample(bs, int(rng.integers(2**31)), "train")
        x0 = torch.from_numpy(images_to_unit(np.stack([e.image for e in batch]))).to(device)
        if v.get("uniform_t"):
            sigma = torch.rand(bs, generator=gen)
        else:
            sigma = torch.sigmoid(torch.randn(bs, generator=gen) + v.get("logit_mean", 1.0))
        eps = torch.randn(x0.shape, generator=gen).to(device)
        sigma = sigma.to(device)
        s = sigma.view(-1, 1, 1, 1)
        xt = (1 - s) * x0 + s * eps
        pred = net(xt, sigma, net.encode([e.caption for e in batch]))
        loss = ((pred - (eps - x0)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step in evals:
            net.eval()
            g = torch.Generator().manual_seed(1234)
            row = {
                "variant": variant,
                "seed": seed,
                "step": step,
                "loss": round(float(np.mean(losses[-50:])), 4),
                "s": round(time.time() - t0, 1),
            }
            row.update(rel_stats(net, world, "held_out", 16, g))
            row.update(rel_stats(net, world, "train", 2, g))
            row.update(probe(net, g))
            net.train()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(sys.argv[3:4] or ["cpu"]), *(int(a) for a in sys.argv[4:5]))
