"""Bad requests test_server.py does not cover, table-driven: each gets a 4xx whose message names
the field, and the next good request is answered (the server keeps serving)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image
from reward_test_helpers import LengthScorer

from unirl.reward.cli import main as cli_main
from unirl.reward.combine import WeightedScorer
from unirl.reward.server.app import create_app
from unirl.reward.server.runner import serve_in_thread
from unirl.reward.server.settings import ServerSettings

MAX_PIXELS = 1000  # an image over 31 x 31, or a video over 1000 pixels in all, is refused
MAX_QUEUE = 64


def _b64(fmt: str, side: int = 4) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((side, side, 3), np.uint8)).save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def _png(side: int = 4) -> dict:
    return {"kind": "encoded", "format": "png", "data": _b64("PNG", side)}


def _item(**media) -> bytes:
    return json.dumps({"items": [{"response": "x", **media}]}).encode()


def _items(n: int) -> bytes:
    return json.dumps({"items": [{"response": "x"}] * n}).encode()


CASES = [
    # malformed JSON: where parsing stopped and why
    ("truncated JSON", b'{"items": [{"response": "x"}', 422, "body: not valid JSON at char 28"),
    ("bare word", b"score this", 422, "body: not valid JSON at char 0"),
    ("empty body", b"", 422, "body: Field required"),
    # wrong types
    ("items an object", b'{"items": {"response": "x"}}', 422, "body.items: Input should be a valid list"),
    ("request_id a number", b'{"items": [{"response": "x"}], "request_id": 5}', 422, "body.request_id"),
    ("metadata nested", b'{"items": [{"response": "x", "metadata": {"a": {"b": 1}}}]}', 422, "metadata.a"),
    ("prompt a list", b'{"items": [{"response": "x", "prompt": ["a"]}]}', 422, "body.items.0.prompt"),
    # huge item counts: over the schema's bound, and over what this server queues at once (which
    # would otherwise get 429 on every retry)
    ("4097 items", _items(4097), 422, "body.items: List should have at most 4096 items"),
    ("items over the queue", _items(MAX_QUEUE + 1), 413, "items: 65 items, more than this server queues"),
    # bad image encodings
    (
        "image not base64",
        _item(image={"kind": "encoded", "format": "png", "data": "@@@@"}),
        422,
        "body.items.0.image.encoded.data: Value error, not valid base64",
    ),
    (
        "image not an image",
        _item(image={"kind": "encoded", "format": "png", "data": "AAAAAAAA"}),
        422,
        "items.0.image: cannot decode png image: the 6 bytes are not a PNG or JPEG file",
    ),
    (
        "JPEG labelled PNG",
        _item(image={"kind": "encoded", "format": "png", "data": _b64("JPEG")}),
        422,
        "items.0.image: image declared format 'png' but the bytes are 'JPEG'",
    ),
    (
        "image format gif",
        _item(image={"kind": "encoded", "format": "gif", "data": _b64("PNG")}),
        422,
        "body.items.0.image.encoded.format",
    ),
    (
        "image without kind",
        _item(image={"format": "png", "data": _b64("PNG")}),
        422,
        "body.items.0.image: Unable to extract tag using discriminator 'kind'",
    ),
    (
        "image array short",
        _item(image={"kind": "array", "shape": [2, 2, 3], "data": "AAAA"}),
        422,
        "body.items.0.image.array: Value error, data has 3 bytes but shape [2, 2, 3]",
    ),
    (
        "image 2 channels",
        _item(image={"kind": "array", "shape": [1, 1, 2], "data": "AAA="}),
        422,
        "body.items.0.image.array: Value error, shape [1, 1, 2]: last dimension (channels)",
    ),
    (
        "image array 4-d",
        _item(image={"kind": "array", "shape": [1, 1, 1, 3], "data": "AAAA"}),
        422,
        "items.0.image: image array must have shape [H, W, C]",
    ),
    (
        "image over max_pixels",
        _item(image=_png(32)),
        422,
        "items.0.image: media has 1024 pixels, more than the limit 1000",
    ),
    # bad video encodings
    (
        "video frame corrupt",
        _item(video={"kind": "frames", "frames": [_png(), {**_png(), "data": "AAAA"}]}),
        422,
        "items.0.video: frame 1: cannot decode png image",
    ),
    (
        "video frames differ",
        _item(video={"kind": "frames", "frames": [_png(4), _png(8)]}),
        422,
        "items.0.video: frame 1 has shape (8, 8, 3), frame 0 has (4, 4, 3)",
    ),
    (
        "video no frames",
        _item(video={"kind": "frames", "frames": []}),
        422,
        "body.items.0.video.frames.frames: List should have at least 1 item",
    ),
    (
        "video array 3-d",
        _item(video={"kind": "array", "shape": [1, 1, 3], "data": "AAAA"}),
        422,
        "items.0.video: video array must have shape [T, H, W, C]",
    ),
    (
        "video over max_pixels",
        _item(video={"kind": "frames", "frames": [_png(20)] * 3}),
        422,
        "items.0.video: frame 2: frames 0..2 have 1200 pixels, more than the limit 1000 for a whole video",
    ),
    (
        "video kind unknown",
        _item(video={"kind": "mp4", "data": "AAAA"}),
        422,
        "body.items.0.video: Input tag 'mp4' found using 'kind' does not match",
    ),
]


@pytest.fixture(scope="module")
def server():
    scorer = LengthScorer()
    settings = ServerSettings(max_pixels=MAX_PIXELS, max_queue_items=MAX_QUEUE, max_batch=MAX_QUEUE)
    with serve_in_thread(create_app(lambda: [WeightedScorer("length", 1.0, scorer)], settings)) as h:
        yield h.url, scorer


@pytest.mark.parametrize(("payload", "status", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_is_4xx_naming_the_field_and_the_server_keeps_serving(server, payload, status, needle):
    url, scorer = server
    before = scorer.scored
    r = httpx.post(url + "/v1/score", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"], r.json()["detail"]
    assert scorer.scored == before  # nothing of a refused request reached the scorer
    good = httpx.post(url + "/v1/score", json={"items": [{"response": "abc"}]})
    assert good.status_code == 200 and good.json()["results"][0]["total"] == 3.0


def test_media_within_the_limits_are_scored(server):
    url, _ = server
    ok = [_item(image=_png(31)), _item(video={"kind": "frames", "frames": [_png(18)] * 3}), _items(MAX_QUEUE)]
    for payload in ok:
        r = httpx.post(url + "/v1/score", content=payload, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("scorers", "needle"),
    [
        (
            "[{scorer: {kind: exact_matc}}]",
            "scorers.0.scorer.kind: unknown scorer kind 'exact_matc'; choose one of",
        ),
        ("[{scorer: {kind: exact_match, bogus: 1}}]", "scorers.0.scorer.exact_match.bogus: Extra inputs"),
        ("{kind: exact_match}", "scorers: Input should be a valid list"),
    ],
)
def test_serve_refuses_an_unknown_scorer_naming_the_path(tmp_path, capsys, scorers, needle):
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"scorers: {scorers}\n")
    assert cli_main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    if "choose one of" in needle:
        assert "'exact_match'" in err and "'math_verify'" in err  # the options are listed


def test_settings_refuse_a_queue_smaller_than_a_batch():
    with pytest.raises(ValueError, match=r"max_queue_items=4 is below server.max_batch=8"):
        ServerSettings(max_batch=8, max_queue_items=4)
