"""Does the tiny Qwen2.5-VL of `shapes_vqa_grpo` learn to read the image? (docs/benchmarks.md, "AR
families and the shapes VQA world")

A plain SFT loop over the recipe's bundle (noise-free answers), scored every 100 steps on held-out
scenes by the best answer of the world's answer set, once with each scene's own image and once with
the images shuffled across questions (the gap is what the model reads from the image); or a linear
probe of an object's colour on the untrained vision tower's features (one-object scenes).

    .venv/bin/python experiments/shapes_vqa_sft_probe.py sft --vision-lr-scale 0 --patch-size 4
    .venv/bin/python experiments/shapes_vqa_sft_probe.py sft --vision-lr-scale 1 --max-objects 1 --colour-only
    .venv/bin/python experiments/shapes_vqa_sft_probe.py probe
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from unirl.apps.worlds.shapes_vqa import ShapesVQAConfig, make_example
from unirl.rollout.ar.vlm_bundle import VLMBundle
from unirl.rollout.ar.vlm_config import VLMConfig
from unirl.rollout.ar.vlm_decode import VisionInputs, replay_multimodal_logprobs

RECIPE = Path(__file__).parents[1] / "apps/src/unirl/apps/recipes/shapes_vqa_grpo.yaml"
ANSWERS = ("0", "1", "2", "3", "4", "red", "green", "blue")


def build(args: argparse.Namespace) -> tuple[VLMBundle, ShapesVQAConfig]:
    rec = yaml.safe_load(RECIPE.read_text())
    model = {**rec["model"], "freeze_vision": args.vision_lr_scale == 0}
    model["tiny"] = {**model["tiny"], "patch_size": args.patch_size}
    data = {**rec["data"], "sft_answer_noise": 0.0, "max_objects": args.max_objects}
    if args.colour_only:  # one-object colour questions: few distinct scenes, so small splits
        data.update(colour_fraction=1.0, num_eval=40, num_train=100)
    return VLMConfig(**model).build(), ShapesVQAConfig(**data)


def encode(b: VLMBundle, records: list) -> tuple[list, list, VisionInputs]:
    eos = b.eos_token_ids[0]
    prompts, answers, pixels, grids = [], [], [], []
    for r in records:
        ids, pv, grid = b.encode_multimodal(r.prompt, [r.images[0]])
        prompts.append(ids)
        answers.append([*b.tokenizer.encode(r.answer, add_special_tokens=False), eos])
        pixels.append(pv)
        grids.append(grid)
    return prompts, answers, VisionInputs(torch.cat(grids), pixel_values=torch.cat(pixels))


@torch.no_grad()
def accuracy(b: VLMBundle, records: list, *, shuffle: bool) -> float:
    """Share of ``records`` whose highest-likelihood answer of ``ANSWERS`` is right."""
    images = [r.images for r in records]
    if shuffle:
        images = images[1:] + images[:1]
    b.model.eval()
    eos = b.eos_token_ids[0]
    cands = [[*b.tokenizer.encode(a, add_special_tokens=False), eos] for a in ANSWERS]
    ok = []
    for r, im in zip(records, images):
        ids, pv, grid = b.encode_multimodal(r.prompt, [im[0]])
        vis = VisionInputs(grid.repeat(len(cands), 1), pixel_values=pv.repeat(len(cands), 1))
        lp = replay_multimodal_logprobs(b, [ids] * len(cands), cands, vis, [1.0] * len(cands))[0].sum(-1)
        ok.append(ANSWERS[int(lp.argmax())] == r.answer)
    b.model.train()
    return 100 * float(np.mean(ok))


def sft(args: argparse.Namespace) -> None:
    b, cfg = build(args)
    src = cfg.build()
    vision = [p for n, p in b.model.named_parameters() if "visual" in n and p.requires_grad]
    rest = [p for n, p in b.model.named_parameters() if "visual" not in n]
    groups = [{"params": rest}] + (
        [{"params": vision, "lr": args.lr * args.vision_lr_scale}] if vision else []
    )
    opt = torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.0)
    held = src.eval_records()[:100]
    t0 = time.time()
    for step in range(args.steps):
        prompts, answers, vis = encode(b, src.sft_records(args.batch_size, seed=0, step=step))
        logp, _ = replay_multimodal_logprobs(b, prompts, answers, vis, [1.0] * len(prompts))
        loss = -logp.sum() / sum(len(a) for a in answers)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(b.model.parameters(), 1.0)
        opt.step()
        if step % 100 == 99 or step == args.steps - 1:
            own, shuffled = accuracy(b, held, shuffle=False), accuracy(b, held, shuffle=True)
            print(f"step {step + 1} loss {loss.item():.3f} held-out {own:.1f}% "
                  f"(images shuffled {shuffled:.1f}%) {time.time() - t0:.0f} s", flush=True)  # fmt: skip


@torch.no_grad()
def probe(args: argparse.Namespace) -> None:
    args.max_objects = 1
    b, cfg = build(args)
    feats, labels = [], []
    for i in range(2000):
        e = make_example(cfg, np.random.default_rng([9, i]))
        _, pv, grid = b.encode_multimodal(e.question, [e.image])
        out = b.model.model.get_image_features(pixel_values=pv, image_grid_thw=grid)
        feats.append(torch.cat(list(out.pooler_output)).flatten())
        labels.append(["red", "green", "blue"].index(e.objects[0].colour))
    x, y = torch.stack(feats), torch.tensor(labels)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    w = torch.zeros(x.shape[1], 3)
    with torch.enable_grad():
        w.requires_grad_(True)
        opt = torch.optim.Adam([w], lr=1e-2)
        for _ in range(500):
            loss = torch.nn.functional.cross_entropy(x[:1500] @ w, y[:1500])
            opt.zero_grad()
            loss.backward()
            opt.step()
    test = float(((x[1500:] @ w).argmax(1) == y[1500:]).float().mean())
    print(f"linear probe of the colour on the untrained tower's features: test accuracy {100 * test:.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("sft", "probe"))
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--vision-lr-scale", type=float, default=0.0, help="0 freezes the vision tower")
    ap.add_argument("--patch-size", type=int, default=4)
    ap.add_argument("--max-objects", type=int, default=4)
    ap.add_argument("--colour-only", action="store_true", help="only colour questions (with --max-objects 1)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.mode == "sft":
        sft(args)
    else:
        probe(args)


if __name__ == "__main__":
    main()
