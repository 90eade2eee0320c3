"""Wire schema and media codec: round trips, strictness, and hostile media."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from unirl.reward.convert import item_to_wire, wire_to_item
from unirl.reward.media import decode_image, encode_image
from unirl.reward.protocol import ScoreItem
from unirl.types.wire import ArrayData, EncodedImage, ScoreRequest, WireItem

IMG = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)


@pytest.mark.parametrize("media", ["png", "array"])
def test_item_round_trip_is_lossless(media):
    video = np.stack([IMG, IMG[::-1]])
    item = ScoreItem(
        prompt="p", response="r", reference="x", image=IMG, video=video, metadata={"n": 2, "c": ["red"]}
    )
    wire = item_to_wire(item, media)
    again = WireItem.model_validate_json(wire.model_dump_json())  # through JSON text
    back = wire_to_item(again)
    assert np.array_equal(back.image, IMG) and np.array_equal(back.video, video)
    assert (back.prompt, back.response, back.reference, dict(back.metadata)) == (
        "p",
        "r",
        "x",
        {"n": 2, "c": ["red"]},
    )


def test_array_json_shape_follows_tensor_codec():
    d = json.loads(ArrayData.from_numpy(IMG).model_dump_json())
    assert d["dtype"] == "uint8" and d["shape"] == [5, 7, 3]
    assert base64.b64decode(d["data"]) == IMG.tobytes()


def test_array_length_mismatch_and_bad_base64_are_rejected():
    with pytest.raises(ValidationError, match="needs 105"):
        ArrayData(shape=[5, 7, 3], data=b"\x00" * 10)
    with pytest.raises(ValidationError, match="base64"):
        ArrayData.model_validate({"shape": [1, 1, 3], "data": "!!!"})
    with pytest.raises(ValidationError, match="channels"):
        ArrayData(shape=[1, 1, 2], data=b"\x00\x00")
    with pytest.raises(TypeError, match="uint8"):
        ArrayData.from_numpy(IMG.astype(np.float32))


def test_strict_fields():
    with pytest.raises(ValidationError, match="Extra inputs"):
        ScoreRequest.model_validate({"items": [{"text": "x"}]})
    with pytest.raises(ValidationError):
        ScoreRequest.model_validate({"items": []})
    with pytest.raises(ValidationError, match="pattern"):
        ScoreRequest.model_validate({"request_id": "bad id with spaces", "items": [{}]})


def test_declared_format_must_match_bytes():
    png = encode_image(IMG, "png")
    with pytest.raises(ValueError, match="declared format 'jpeg'"):
        decode_image(EncodedImage(format="jpeg", data=png.data))
    with pytest.raises(ValueError, match="cannot decode"):
        decode_image(EncodedImage(format="png", data=b"\x89PNG garbage"))


def test_decompression_bomb_rejected_before_decoding():
    # A 3000x3000 black PNG is ~30 kB compressed but 9 M pixels: rejected from its header.
    buf = io.BytesIO()
    Image.new("L", (3000, 3000)).save(buf, format="PNG")
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(ValueError, match="more than the limit"):
        decode_image(EncodedImage(format="png", data=buf.getvalue()), max_pixels=1_000_000)


def test_grey_and_rgba_become_rgb():
    grey = ArrayData.from_numpy(IMG[..., :1])
    assert decode_image(grey).shape == (5, 7, 3)
    rgba = np.concatenate([IMG, np.full((5, 7, 1), 255, np.uint8)], axis=-1)
    assert np.array_equal(decode_image(encode_image(rgba[..., :3])), IMG)
