"""GPU checks (device machine only): rollout -> replay parity in fp32 and bf16 on CUDA."""

from __future__ import annotations

import pytest
import torch

from unirl.rollout.models.sd3 import SD3Bundle
from unirl.rollout.pipelines import FlowMatchPipeline
from unirl.types import DiffusionSamplingParams, NoiseRecipe, Sample, TextPrimitive

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-6)])
@pytest.mark.parametrize("strategy", ["flow_sde", "dance_sde"])
def test_cuda_rollout_replay_parity(dtype: torch.dtype, atol: float, strategy: str) -> None:
    bundle = SD3Bundle.tiny(seed=0).to("cuda", dtype)
    p = DiffusionSamplingParams(
        num_steps=6, guidance_scale=4.5, height=16, width=16, sde_strategy=strategy, noise=NoiseRecipe(seed=5)
    )
    pipe = FlowMatchPipeline(bundle, default_params=p)
    samples = [
        Sample(
            id=f"s{i}", group_id=f"g{i % 2}", inputs=[TextPrimitive(text=["a red circle", "two dots"][i % 2])]
        )
        for i in range(4)
    ]
    parts = [s.part("diffusion") for s in pipe.generate(samples, rollout_step=0)]
    assert parts[0].conditions["prompt_embeds"].dtype == dtype
    for n, j in enumerate(parts[0].segment.sde_indices):
        with torch.no_grad():
            r = pipe.replay_step(parts, j)
        stored = torch.stack([q.segment.log_probs[n] for q in parts]).cuda()
        torch.testing.assert_close(r.log_prob, stored, atol=atol, rtol=0)
