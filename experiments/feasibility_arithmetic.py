"""Feasibility probe: SFT a tiny from-scratch Qwen3 on the arithmetic world on CPU.

Builds `CausalLMBundle.tiny_qwen3` (character tokenizer, no chat template), trains token
cross-entropy on the answer tokens + EOS of "12+7=" -> "19", and every `eval_every_s` seconds
greedy-decodes held-out prompts and scores them with the exact-match checker. One JSON line per
evaluation; timings on a shared CPU are noisy.

    python experiments/feasibility_arithmetic.py --budget-s 120 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from unirl.apps.worlds.arithmetic import ArithmeticProblem, ArithmeticWorld, ArithmeticWorldConfig
from unirl.rollout.ar.bundle import CausalLMBundle

CHARACTERS = "0123456789+-*="


@dataclass
class ArithmeticFeasibilityConfig:
    """One probe run (model sizes are Qwen3Config fields)."""

    levels: str = "0,1,2,4"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 30
    budget_s: float = 120.0
    eval_every_s: float = 20.0
    eval_problems: int = 400
    max_steps: int = 0
    seed: int = 0


def encode_batch(
    bundle: CausalLMBundle, problems: list[ArithmeticProblem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 except answer tokens and EOS)."""
    tok = bundle.tokenizer
    rows, labels = [], []
    for p in problems:
        prompt = tok.encode(p.prompt, add_special_tokens=False)
        answer = [*tok.encode(p.target, add_special_tokens=False), tok.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, (ids != tok.pad_token_id) | (lab != -100), lab


@torch.no_grad()
def greedy_accuracy(bundle: CausalLMBundle, problems: list[ArithmeticProblem]) -> dict[str, float]:
    """Greedy decode (left-padded batch, 6 new tokens) and exact-match accuracy, overall and per level."""
    tok, model = bundle.tokenizer, bundle.model
    model.eval()
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc,
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train()
    correct = np.array([p.check(t).correct for p, t in zip(problems, texts)])
    levels = np.array([p.level for p in problems])
    row = {"acc": float(correct.mean())}
    for lv in sorted(set(levels.tolist())):
        row[f"acc_L{lv}"] = float(correct[levels == lv].mean())
    return row


def run(cfg: ArithmeticFeasibilityConfig) -> list[dict[str, float]]:
    """SFT for cfg.budget_s train-seconds, evaluating every cfg.eval_every_s; returns the eval rows."""
    torch.manual_seed(cfg.seed)
    world = ArithmeticWorld(ArithmeticWorldConfig(levels=tuple(int(v) for v in cfg.levels.split(","))))
    bundle = CausalLMBundle.tiny_qwen3(
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=32,
        characters=CHARACTERS,
        chat_template=False,
        seed=cfg.seed,
    )
    model = bundle.model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / cfg.warmup_steps))
    held_out = world.sample(cfg.eval_problems, 777, "held_out")
    train_eval = world.sample(cfg.eval_problems // 2, 778, "train")
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"config": asdict(cfg), "params": n_params}), flush=True)
    rows: list[dict[str, float]] = []
    rng = np.random.default_rng(cfg.seed)
    train_s, step, next_eval, t_start, losses = 0.0, 0, cfg.eval_every_s, time.time(), []
    while True:
        t0 = time.time()
        ids, mask, labels = encode_batch(
            bundle, world.sample(cfg.batch_size, int(rng.integers(2**31)), "train")
        )
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        losses.append(loss.item())
        train_s += time.time() - t0
        done = train_s >= cfg.budget_s or step == cfg.max_steps
        if train_s >= next_eval or done:
            row: dict[str, float] = {
                "step": step,
                "train_s": round(train_s, 1),
                "loss": float(np.mean(losses[-20:])),
            }
            row.update({f"held_out_{k}": v for k, v in greedy_accuracy(bundle, held_out).items()})
            row.update({f"train_{k}": v for k, v in greedy_accuracy(bundle, train_eval).items()})
            row["wall_s"] = round(time.time() - t_start, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            next_eval += cfg.eval_every_s
            if done:
                return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, value in asdict(ArithmeticFeasibilityConfig()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--threads", type=int, default=2)
    args = vars(parser.parse_args(argv))
    torch.set_num_threads(args.pop("threads"))
    run(ArithmeticFeasibilityConfig(**args))


if __name__ == "__main__":
    main()
