"""Bad input: each a clear error naming the field and the value."""

import numpy as np
import pytest
from pydantic import ValidationError

from unirl.types import (
    SCHEMA_VERSION,
    ImagePrimitive,
    LatentTrajectory,
    Part,
    Reward,
    Sample,
    TextSegment,
    from_json,
)


def traj(**kw):
    base = dict(
        latents=np.zeros((3, 4), np.float32),
        positions=[0, 1, 2],
        sigmas=[1.0, 0.5, 0.0],
        sde_indices=[0, 1],
        log_probs=np.zeros(2, np.float32),
    )
    return LatentTrajectory(**(base | kw))


def test_unknown_field_is_named():
    with pytest.raises(ValidationError, match="groupid"):
        Sample(id="a", group_id="g", groupid="typo")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        from_json(Sample, '{"id": "a", "group_id": "g", "bogus": 1}')


def test_wrong_dtype_and_shape():
    with pytest.raises(ValidationError, match=r"log_probs must be float32 \[2\].*float64 \[2\]"):
        traj(log_probs=np.zeros(2, np.float64))
    with pytest.raises(ValidationError, match=r"log_probs must be float32 \[2\].*float32 \[3\]"):
        traj(log_probs=np.zeros(3, np.float32))
    with pytest.raises(ValidationError, match=r"pixels must be uint8 \[H, W, C\].*float32 \[2, 2, 3\]"):
        ImagePrimitive(pixels=np.zeros((2, 2, 3), np.float32))
    with pytest.raises(ValidationError, match=r"loss_mask has shape \[2\]; expected \[3\]"):
        TextSegment(prompt_ids=[1], response_ids=[1, 2, 3], loss_mask=np.ones(2, bool))
    with pytest.raises(ValidationError, match="expected a torch.Tensor, numpy.ndarray"):
        traj(latents=[[0.0]])


def test_trajectory_must_store_what_replay_needs():
    with pytest.raises(ValidationError, match=r"sde steps \[1\] need latents at j and j\+1"):
        traj(latents=np.zeros((2, 4), np.float32), positions=[0, 1])
    with pytest.raises(ValidationError, match=r"sde_indices must be strictly increasing in 0..1"):
        traj(sde_indices=[0, 2])


def test_nan_reward():
    with pytest.raises(ValidationError, match="reward total must be finite; got nan"):
        Reward(total=float("nan"))
    with pytest.raises(ValidationError, match="components must be finite"):
        Reward(total=1.0, components={"ocr": float("inf")})


def test_lineage_errors():
    with pytest.raises(ValidationError, match="duplicate part name 'ar'"):
        Sample(id="s", group_id="g", parts=[Part(name="ar"), Part(name="ar")])
    with pytest.raises(ValidationError, match="parent 'ar', which is not an earlier part"):
        Sample(id="s", group_id="g", parts=[Part(name="diffusion", parent="ar")])


def test_schema_version_mismatch():
    with pytest.raises(
        ValidationError, match=f"schema_version=99 but this unirl-types reads version {SCHEMA_VERSION}"
    ):
        Sample(id="s", group_id="g", schema_version=99)


def test_part_lookup_error_lists_parts():
    s = Sample(id="s", group_id="g", parts=[Part(name="ar")])
    with pytest.raises(KeyError, match="has no part 'diffusion'; parts: \\['ar'\\]"):
        s.part("diffusion")
    assert s.ensure_part("diffusion", parent="ar").parent == "ar"
    assert traj().latent_at(2).shape == (4,)
