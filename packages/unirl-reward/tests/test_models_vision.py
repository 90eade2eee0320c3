"""Aesthetic, video PickScore, ImageReward, TrOCR and OwlViT scorers on tiny random models.

Each is built through its typed config (`ServiceConfig` -> from_pretrained on a local folder),
so the loading path, preprocessing, batching and dtype handling all run.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
torch.set_num_threads(1)

from safetensors.torch import save_file  # noqa: E402
from tiny_models import tiny_blip_imagereward, tiny_clip, tiny_owlvit, tiny_trocr  # noqa: E402

from unirl.reward.config import ServiceConfig  # noqa: E402
from unirl.reward.models.imagereward import MEAN, STD  # noqa: E402
from unirl.reward.models.mlp_head import build_head  # noqa: E402
from unirl.reward.protocol import ScoreItem  # noqa: E402
from unirl.reward.testing import ScorerContract  # noqa: E402

RNG = np.random.default_rng(0)
IMAGES = [RNG.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(32, 32), (40, 48), (24, 64)]]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("vision")


def _build(kind: str, **kw):
    (entry,) = ServiceConfig.model_validate({"scorers": [{"scorer": {"kind": kind, **kw}}]}).build()
    return entry.scorer


@pytest.fixture(scope="module")
def aesthetic(root):
    clip = tiny_clip(root)
    torch.manual_seed(1)
    head = build_head(16)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(root / "head.safetensors"))
    return _build("aesthetic", model_path=str(clip), head_path=str(root / "head.safetensors"), batch_size=2)


@pytest.fixture(scope="module")
def video(root):
    return _build("video_pickscore", model_path=str(tiny_clip(root)), max_frames=3, batch_size=4)


@pytest.fixture(scope="module")
def imagereward(root):
    return _build("imagereward", model_path=str(tiny_blip_imagereward(root)), batch_size=2)


@pytest.fixture(scope="module")
def ocr(root):
    return _build("ocr", model_path=str(tiny_trocr(root)), batch_size=2)


@pytest.fixture(scope="module")
def geneval(root):
    return _build("geneval", model_path=str(tiny_owlvit(root)), score_threshold=0.0, batch_size=2)


def test_aesthetic_is_head_of_normalised_embedding(aesthetic):
    emb = aesthetic.backbone.image_embeds(IMAGES)
    assert torch.allclose(emb.norm(dim=-1), torch.ones(3), atol=1e-5)
    with torch.no_grad():
        expected = aesthetic.head(emb).squeeze(-1).tolist()
    assert [r.total for r in aesthetic.score([ScoreItem(image=i) for i in IMAGES])] == pytest.approx(
        expected, abs=1e-5
    )


def test_aesthetic_head_width_mismatch(root, aesthetic):
    from unirl.reward.models.aesthetic import AestheticScorer

    with pytest.raises(ValueError, match="expects 8-d"):
        AestheticScorer(aesthetic.backbone, build_head(8))


def test_video_mean_of_frame_pickscores(video):
    vid = np.stack(
        [IMAGES[0], IMAGES[0][::-1], IMAGES[0][:, ::-1], IMAGES[0]]
    )  # 4 frames -> indices 0, 2, 3 (round)
    (res,) = video.score([ScoreItem(prompt="a red cube", video=vid)])
    bb = video.backbone
    frames = [vid[0], vid[2], vid[3]]
    per = (bb.logit_scale() * (bb.image_embeds(frames) * bb.text_embeds(["a red cube"])).sum(-1)).tolist()
    assert res.total == pytest.approx(sum(per) / 3, abs=1e-4)
    assert res.components["frame_min"] == pytest.approx(min(per), abs=1e-4)


def test_imagereward_normalisation(imagereward):
    # Undo the authors' normalisation and recompute the head on the [CLS] state by hand.
    (r,) = imagereward.score([ScoreItem(prompt="a red cube", image=IMAGES[0])])
    raw = r.total * STD + MEAN
    blip, proc = imagereward.blip, imagereward.processor
    with torch.no_grad():
        pix = proc(images=[IMAGES[0]], return_tensors="pt")["pixel_values"]
        enc = proc(
            text=["a red cube"], padding="max_length", max_length=35, truncation=True, return_tensors="pt"
        )
        img = blip.vision_model(pixel_values=pix).last_hidden_state
        cls = blip.text_encoder(
            input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], encoder_hidden_states=img
        ).last_hidden_state[:, 0]
        assert raw == pytest.approx(imagereward.head(cls).item(), abs=1e-4)


def test_ocr_engine_reads_and_scores_in_range(ocr):
    texts = ocr.engine.read(IMAGES)
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    res = ocr.score([ScoreItem(prompt='a sign "abc"', image=i) for i in IMAGES])
    assert all(0.0 <= r.total <= 1.0 for r in res)


def test_owlvit_boxes_inside_image(geneval):
    dets = geneval.detector.detect(IMAGES[:2], [["cube"], ["cube", "ball"]])
    assert len(dets) == 2 and dets[1]  # threshold 0: a random detector still finds boxes
    h, w = IMAGES[1].shape[:2]
    for d in dets[1]:
        x0, y0, x1, y1 = d.box
        assert 0 <= x0 <= x1 <= w and 0 <= y0 <= y1 <= h and d.label in ("cube", "ball")


class TestVisionContract(ScorerContract):
    atol = 1e-4

    @pytest.fixture(params=["aesthetic", "video", "imagereward", "ocr", "geneval"])
    def scorer(self, request):
        return request.getfixturevalue(request.param)

    @pytest.fixture
    def items(self, scorer):
        meta = {"objects": ["cube", "ball"], "position": "left of"}
        vids = [np.stack([im, im[::-1]]) for im in IMAGES]
        return [
            ScoreItem(prompt='a sign that says "red cube"', image=im, video=v, metadata=meta)
            for im, v in zip(IMAGES, vids)
        ]
