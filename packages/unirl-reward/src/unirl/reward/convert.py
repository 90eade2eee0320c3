"""Conversions between `ScoreItem`/`ScoreResult` and the wire schema (`unirl.types.wire`)."""

from __future__ import annotations

from typing import Literal

from unirl.reward.media import DEFAULT_MAX_PIXELS, decode_image, decode_video, encode_image
from unirl.reward.protocol import ScoreItem, ScoreResult
from unirl.types.wire import ArrayData, EncodedFrames, EncodedImage, WireItem, WireScore

MediaEncoding = Literal["png", "jpeg", "array"]


class MediaError(ValueError):
    """An item's image or video does not decode; `field` is "image" or "video"."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def item_to_wire(item: ScoreItem, media: MediaEncoding = "png") -> WireItem:
    """Encode one item for a request. `media="png"` is lossless and small; "array" skips compression."""
    image: EncodedImage | ArrayData | None = None
    video: EncodedFrames | ArrayData | None = None
    if item.image is not None:
        image = ArrayData.from_numpy(item.image) if media == "array" else encode_image(item.image, media)
    if item.video is not None:
        if media == "array":
            video = ArrayData.from_numpy(item.video)
        else:
            video = EncodedFrames(frames=[encode_image(f, media) for f in item.video])
    return WireItem(
        prompt=item.prompt,
        response=item.response,
        reference=item.reference,
        image=image,
        video=video,
        metadata=dict(item.metadata),
    )


def wire_to_item(wire: WireItem, max_pixels: int = DEFAULT_MAX_PIXELS) -> ScoreItem:
    """Decode one request item; MediaError (a ValueError naming the field) for corrupt or oversized media."""
    image = video = None
    try:
        image = decode_image(wire.image, max_pixels) if wire.image is not None else None
    except ValueError as e:
        raise MediaError("image", str(e)) from e
    try:
        video = decode_video(wire.video, max_pixels) if wire.video is not None else None
    except ValueError as e:
        raise MediaError("video", str(e)) from e
    return ScoreItem(
        prompt=wire.prompt,
        response=wire.response,
        reference=wire.reference,
        image=image,
        video=video,
        metadata=dict(wire.metadata),
    )


def result_to_wire(result: ScoreResult) -> WireScore:
    return WireScore(total=result.total, components=dict(result.components))


def wire_to_result(wire: WireScore) -> ScoreResult:
    return ScoreResult(total=wire.total, components=dict(wire.components))
