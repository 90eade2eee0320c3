"""The MLP reward head shared by the LAION aesthetic predictor and ImageReward.

Both use Linear(d, 1024) -> Dropout(0.2) -> Linear(1024, 128) -> Dropout(0.2) ->
Linear(128, 64) -> Dropout(0.1) -> Linear(64, 16) -> Linear(16, 1), state-dict keys
`layers.{0,2,4,6,7}.{weight,bias}` (no activations: the authors' head is affine).
Weights load from safetensors only, never from a pickled .pth.
"""

from __future__ import annotations

from typing import Any

from unirl.reward.models._extras import require


def build_head(input_dim: int) -> Any:
    """The head as a torch module with the authors' layer indices."""
    torch = require("models", "torch")
    nn = torch.nn

    class RewardHead(nn.Module):  # type: ignore[name-defined]  # torch is imported lazily
        def __init__(self) -> None:
            super().__init__()
            self.input_dim = input_dim
            self.layers = nn.Sequential(
                nn.Linear(input_dim, 1024),
                nn.Dropout(0.2),
                nn.Linear(1024, 128),
                nn.Dropout(0.2),
                nn.Linear(128, 64),
                nn.Dropout(0.1),
                nn.Linear(64, 16),
                nn.Linear(16, 1),
            )

        def forward(self, x: Any) -> Any:
            return self.layers(x)

    return RewardHead()


def load_head(path: str, prefix: str = "") -> Any:
    """Build the head from a safetensors file; the input width is read from `layers.0.weight`."""
    st = require("models", "safetensors.torch")
    state = st.load_file(path)
    if prefix:
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    key = "layers.0.weight"
    if key not in state:
        raise ValueError(f"{path}: no {prefix}{key} tensor; expected the LAION/ImageReward MLP head layout")
    head = build_head(int(state[key].shape[1]))
    head.load_state_dict(state)
    return head.eval()
