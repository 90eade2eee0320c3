"""CLIP score, PickScore, HPSv2 and the aesthetic head on a tiny random CLIPModel."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from tiny_models import tiny_clip  # noqa: E402

from unirl.reward.models.clip import ClipBackbone, ClipScorer, HPSv2Scorer, PickScoreScorer  # noqa: E402
from unirl.reward.protocol import ScoreItem  # noqa: E402
from unirl.reward.testing import ScorerContract  # noqa: E402

RNG = np.random.default_rng(0)
IMAGES = [RNG.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(32, 32), (48, 40), (20, 64)]]
PROMPTS = ["a red cube", "two blue balls", "a photo of a cat"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return tiny_clip(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def backbone(clip_dir):
    return ClipBackbone.from_pretrained(str(clip_dir), batch_size=2)  # batch 2 < 3 items: chunking runs


def _items():
    return [ScoreItem(prompt=p, image=im) for p, im in zip(PROMPTS, IMAGES)]


def test_formulas_against_direct_computation(backbone):
    # Independent path: the HF model's own forward (logits_per_image = scale * cos).
    m, proc = backbone.model, backbone.processor
    enc = proc(text=PROMPTS, images=IMAGES, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = m(**enc).logits_per_image.diagonal()  # [3]
    scale = m.logit_scale.exp().item()
    cos = (logits / scale).tolist()
    pick = PickScoreScorer(backbone).score(_items())
    clip = ClipScorer(backbone).score(_items())
    hps = HPSv2Scorer(backbone).score(_items())
    for c, p, s, h in zip(cos, pick, clip, hps):
        assert p.total == pytest.approx(min(scale, 100.0) * c, abs=1e-4)
        assert s.total == pytest.approx(100 * max(c, 0.0), abs=1e-3)
        assert h.total == pytest.approx(c, abs=1e-5)


def test_bfloat16_runs_and_is_close(clip_dir, backbone):
    bf = ClipBackbone.from_pretrained(str(clip_dir), dtype="bfloat16")
    a = HPSv2Scorer(backbone).score(_items())
    b = HPSv2Scorer(bf).score(_items())
    assert all(math.isclose(x.total, y.total, abs_tol=0.05) for x, y in zip(a, b))


def test_missing_extra_names_pip_command(monkeypatch):
    import builtins

    from unirl.reward.models._extras import MissingExtraError, require

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "not_installed_mod":
            raise ImportError("No module named 'not_installed_mod'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(MissingExtraError, match=r"pip install 'unirl-reward\[clip\]'"):
        require("clip", "not_installed_mod")


class TestClipContract(ScorerContract):
    @pytest.fixture(params=[ClipScorer, PickScoreScorer, HPSv2Scorer])
    def scorer(self, request, backbone):
        return request.param(backbone)

    @pytest.fixture
    def items(self):
        return _items()
