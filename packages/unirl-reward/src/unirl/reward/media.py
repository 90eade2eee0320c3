"""Image/video codec between the wire schema and uint8 RGB numpy arrays (Pillow, no torch).

Decoding is bounded: a PNG/JPEG whose header claims more than `max_pixels` pixels is rejected
before its pixels are decompressed (a decompression bomb never reaches memory).
"""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np
from PIL import Image

from unirl.types.wire import ArrayData, EncodedFrames, EncodedImage

DEFAULT_MAX_PIXELS = 4096 * 4096


def to_rgb_uint8(array: np.ndarray) -> np.ndarray:
    """Normalise a uint8 array with 1, 3 or 4 channels (last axis) to 3-channel RGB."""
    if array.dtype != np.uint8:
        raise TypeError(f"pixels must be uint8, got {array.dtype}; scale to [0, 255] and .astype(np.uint8)")
    channels = array.shape[-1]
    if channels == 3:
        return array
    if channels == 1:
        return np.repeat(array, 3, axis=-1)
    if channels == 4:
        return array[..., :3]
    raise ValueError(f"pixels must have 1, 3 or 4 channels in the last axis, got shape {array.shape}")


def encode_image(pixels: np.ndarray, fmt: Literal["png", "jpeg"] = "png", quality: int = 95) -> EncodedImage:
    """Compress a uint8 [H, W, 3] array to PNG or JPEG for the wire."""
    buf = io.BytesIO()
    img = Image.fromarray(to_rgb_uint8(pixels))
    if fmt == "png":
        img.save(buf, format="PNG")
    elif fmt == "jpeg":
        img.save(buf, format="JPEG", quality=quality)
    else:
        raise ValueError(f"fmt must be 'png' or 'jpeg', got {fmt!r}")
    return EncodedImage(format=fmt, data=buf.getvalue())


def decode_image(image: EncodedImage | ArrayData, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Wire image -> uint8 RGB [H, W, 3]; ValueError for a corrupt, mislabelled or oversized image."""
    if isinstance(image, ArrayData):
        if len(image.shape) != 3:
            raise ValueError(f"image array must have shape [H, W, C], got {image.shape}")
        _check_pixels(image.shape[0] * image.shape[1], max_pixels)
        return to_rgb_uint8(image.to_numpy())
    try:
        with Image.open(io.BytesIO(image.data)) as img:
            if img.format is None or img.format.lower() != image.format:
                raise ValueError(f"image declared format {image.format!r} but the bytes are {img.format!r}")
            _check_pixels(img.width * img.height, max_pixels)
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except ValueError:
        raise
    except Image.UnidentifiedImageError as e:  # its message is the repr of our BytesIO
        raise ValueError(
            f"cannot decode {image.format} image: the {len(image.data)} bytes are not a PNG or JPEG file"
        ) from e
    except Exception as e:  # PIL raises many types for corrupt data; all are a client error here
        raise ValueError(f"cannot decode {image.format} image: {type(e).__name__}: {e}") from e


def decode_video(video: EncodedFrames | ArrayData, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Wire video -> uint8 RGB [T, H, W, 3]; frames must share one size; total pixels bounded."""
    if isinstance(video, ArrayData):
        if len(video.shape) != 4:
            raise ValueError(f"video array must have shape [T, H, W, C], got {video.shape}")
        _check_pixels(video.shape[0] * video.shape[1] * video.shape[2], max_pixels)
        return to_rgb_uint8(video.to_numpy())
    frames: list[np.ndarray[Any, Any]] = []
    budget = max_pixels
    for i, frame in enumerate(video.frames):
        try:
            arr = decode_image(frame, max_pixels=budget)
        except TooManyPixels as e:
            total = max_pixels - budget + e.n
            raise ValueError(
                f"frame {i}: frames 0..{i} have {total} pixels, more than the limit {max_pixels} "
                "for a whole video; send fewer or smaller frames"
            ) from e
        except ValueError as e:
            raise ValueError(f"frame {i}: {e}") from e
        budget -= arr.shape[0] * arr.shape[1]
        if frames and arr.shape != frames[0].shape:
            raise ValueError(f"frame {i} has shape {arr.shape}, frame 0 has {frames[0].shape}")
        frames.append(arr)
    return np.stack(frames)


class TooManyPixels(ValueError):
    """Media over the server's `max_pixels` (per image; per video, all frames together)."""

    def __init__(self, n: int, max_pixels: int) -> None:
        super().__init__(f"media has {n} pixels, more than the limit {max_pixels}; send smaller media")
        self.n, self.max_pixels = n, max_pixels


def _check_pixels(n: int, max_pixels: int) -> None:
    if n > max_pixels:
        raise TooManyPixels(n, max_pixels)
