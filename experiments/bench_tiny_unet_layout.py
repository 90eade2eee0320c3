"""CPU time of one TinyUNet forward + backward (64 samples, 32x32, the recipe's options) with NHWC
activations (as TinyUNet.forward runs) and with NCHW (its channels_last request made a no-op).

    python experiments/bench_tiny_unet_layout.py nchw|nhwc     # docs/experiments/shapes_history.md, issue 6
"""

import sys
import time
import types

import torch

import unirl.rollout.models.tiny.unet as U

torch.set_num_threads(2)

fmt = sys.argv[1]
if fmt == "nchw":  # the forward's channels_last request becomes a no-op
    proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    proxy.channels_last = torch.contiguous_format
    U.torch = proxy
for c in (32, 24, 16):
    net = U.TinyUNet(3, c, 64, 64, coord_channels=True, text_layers=2)
    x, txt, p, s = (
        torch.randn(64, 3, 32, 32),
        torch.randn(64, 12, 64),
        torch.randn(64, 64),
        torch.rand(64) * 1000,
    )
    for _ in range(2):
        net(x, txt, p, s)[0].pow(2).mean().backward()
    t = time.time()
    for _ in range(6):
        net(x, txt, p, s)[0].pow(2).mean().backward()
    print(fmt, c, round((time.time() - t) / 6, 3))
