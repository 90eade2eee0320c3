"""Which torch build to install on this machine, as arguments for `uv pip install`.

One place decides it for ./dev and noxfile.py:
- UNIRL_TORCH set: used verbatim (e.g. "torch==2.11.0" or a path to a wheel).
- an NVIDIA GPU visible (nvidia-smi on PATH): the normal PyPI build, which is the CUDA one.
- a CPU machine with a local CPU wheel in UNIRL_WHEELS (default /opt/wheels): that wheel,
  so a fresh laptop/CI box installs in seconds instead of downloading several GB of CUDA.
- any other CPU machine: the CPU build from the PyTorch CPU index.
Prints one argument per line.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

TORCH_RANGE = "torch>=2.11,<2.14"


def torch_args() -> list[str]:
    explicit = os.environ.get("UNIRL_TORCH")
    if explicit:
        return [explicit]
    if shutil.which("nvidia-smi"):
        return [TORCH_RANGE]
    wheels = os.environ.get("UNIRL_WHEELS", "/opt/wheels")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    local = sorted(glob.glob(os.path.join(wheels, f"torch-2.1[1-3].*+cpu-{tag}-*.whl")))
    if local:
        return [local[-1]]
    return ["--extra-index-url", "https://download.pytorch.org/whl/cpu", TORCH_RANGE]


if __name__ == "__main__":
    print("\n".join(torch_args()))
