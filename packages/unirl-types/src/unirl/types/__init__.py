"""unirl.types: the pydantic Sample schema every unirl package speaks.

Importable without torch; tensor fields hold torch tensors or numpy arrays as given.
"""

from unirl.types.advantages import AdvantageConfig, AdvantageMode, compute_advantages
from unirl.types.media import AudioPrimitive, ImagePrimitive, Primitive, TextPrimitive, VideoPrimitive
from unirl.types.params import (
    ARSamplingParams,
    ComposedSamplingParams,
    DiffusionSamplingParams,
    NoiseRecipe,
    SamplingParams,
    SDEStrategyName,
)
from unirl.types.reward import Reward
from unirl.types.sample import (
    SCHEMA_VERSION,
    Conditions,
    Part,
    PartStatus,
    Sample,
    SampleMetadata,
    compute_sample_advantages,
)
from unirl.types.sde_schedule import AllSteps, KOfWindow, SDESchedule, SlidingWindow
from unirl.types.segment import LatentTrajectory, Segment, TextSegment
from unirl.types.serialize import from_bytes, from_json, list_from_bytes, to_bytes, to_json
from unirl.types.tensor import Tensor, decode_tensor, encode_tensor, is_tensor, to_numpy, to_torch
from unirl.types.version import VersionSpan, WeightStamp

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "ARSamplingParams",
    "AdvantageConfig",
    "AdvantageMode",
    "AllSteps",
    "AudioPrimitive",
    "ComposedSamplingParams",
    "Conditions",
    "DiffusionSamplingParams",
    "ImagePrimitive",
    "KOfWindow",
    "LatentTrajectory",
    "NoiseRecipe",
    "Part",
    "PartStatus",
    "Primitive",
    "Reward",
    "SDESchedule",
    "SDEStrategyName",
    "Sample",
    "SampleMetadata",
    "SamplingParams",
    "Segment",
    "SlidingWindow",
    "Tensor",
    "TextPrimitive",
    "TextSegment",
    "VersionSpan",
    "VideoPrimitive",
    "WeightStamp",
    "compute_advantages",
    "compute_sample_advantages",
    "decode_tensor",
    "encode_tensor",
    "from_bytes",
    "from_json",
    "is_tensor",
    "list_from_bytes",
    "to_bytes",
    "to_json",
    "to_numpy",
    "to_torch",
]
