"""LayoutConfig: selection by config, and batch/geometry checks that fail before any worker starts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from unirl.apps.config import load_dict, validate
from unirl.apps.distributed import LayoutConfig, check_layout
from unirl.apps.distributed.recipes import ARLayoutRecipe

EXACT = {"scorers": [{"name": "exact", "weight": 1.0, "scorer": {"kind": "exact_match", "extractor": "raw"}}]}


def recipe(*overrides: str) -> ARLayoutRecipe:
    data = load_dict("arithmetic_grpo", list(overrides))
    data["reward"] = EXACT
    return validate(ARLayoutRecipe, data)


def test_default_layout_is_single_process() -> None:
    assert recipe().layout == LayoutConfig(kind="single")


def test_layout_is_selected_by_overrides() -> None:
    lay = recipe(
        "layout.kind=ray", "layout.placement=separate", "layout.train_workers=2", "layout.sync=shm"
    ).layout
    assert (lay.kind, lay.placement, lay.train_workers, lay.rollout_workers, lay.sync.kind) == (
        "ray", "separate", 2, 1, "shm"
    )  # fmt: skip


def test_unknown_layout_fields_and_values_fail_at_load() -> None:
    with pytest.raises(ValueError, match="layout.placement"):
        recipe("layout.placement=spread")
    with pytest.raises(ValueError, match="layout.trainers"):
        recipe("layout.trainers=2")
    with pytest.raises(ValidationError, match="colocate"):
        LayoutConfig(kind="ray", device="gpu", placement="colocate", sync="broadcast")


def test_batch_must_split_over_train_workers() -> None:
    # shipped recipe: 16 prompts x 8 samples = 128 Parts, micro_batch_size 128 (per rank)
    r = recipe()
    check_layout(r, LayoutConfig(kind="ray", train_workers=1))
    with pytest.raises(ValueError, match=r"train_workers=3 does not divide the RL batch .* = 128"):
        check_layout(r, LayoutConfig(kind="ray", train_workers=3))
    # 128 / 2 = 64 Parts per rank < micro_batch_size 128: the per-rank geometry is wrong
    with pytest.raises(ValueError, match=r"per-rank shard 64\).*micro_batch_size=128"):
        check_layout(r, LayoutConfig(kind="ray", train_workers=2))
    check_layout(recipe("rl.geometry.micro_batch_size=64"), LayoutConfig(kind="ray", train_workers=2))
    with pytest.raises(ValueError, match="does not divide sft.batch_size=127"):
        check_layout(
            recipe("sft.batch_size=127", "rl.geometry.micro_batch_size=64"), LayoutConfig(train_workers=2)
        )


def test_readme_layout_example_is_valid() -> None:
    """The README's layout block validates, and its command's batch split passes check_layout."""
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = yaml.safe_load(text.split("## Layouts")[1].split("```yaml")[1].split("```")[0])
    r = recipe(
        *(f"layout.{k}={v}".lower() for k, v in block["layout"].items()),
        f"checkpoint_format={block['checkpoint_format']}",
        "rl.geometry.micro_batch_size=64",  # as the README's command line
    )
    assert (r.layout.kind, r.layout.train_workers, r.checkpoint_format) == ("ray", 2, "sharded")
    check_layout(r, r.layout)


def test_sync_accepts_the_plain_kind_and_a_mapping_with_options() -> None:
    """``layout.sync: buckets`` (shipped recipes, user configs) and ``{kind: ..., options}`` both load."""
    from unirl.distributed.weightsync import BucketsSync, ShmSync

    assert recipe("layout.kind=ray", "layout.sync=buckets").layout.sync == BucketsSync()
    lay = recipe("layout.kind=ray", "layout.sync.kind=shm", "layout.sync.max_bucket_bytes=4096").layout
    assert lay.sync == ShmSync(max_bucket_bytes=4096)
    with pytest.raises(ValueError, match="layout.sync"):
        recipe("layout.kind=ray", "layout.sync=nccl")


def test_cuda_ipc_is_selectable_on_gpu_colocate_and_refused_elsewhere() -> None:
    from unirl.apps.distributed.workers import make_weight_sync
    from unirl.distributed.weightsync import CudaIpcWeightSync, Endpoint, EngineSync

    lay = LayoutConfig(kind="ray", device="gpu", placement="colocate", sync="cuda_ipc")  # type: ignore[arg-type]  # coerced
    assert lay.sync.kind == "cuda_ipc" and not lay.sync.streaming
    # the workers' selection path (the CUDA copy itself runs only in the gpu-marked tests)
    sync = make_weight_sync(lay.sync, Endpoint("rollout0", is_source=False))
    assert isinstance(sync, CudaIpcWeightSync) and not sync.is_source
    with pytest.raises(ValidationError, match=r"layout.sync='cuda_ipc' with layout.device='cpu'"):
        LayoutConfig(kind="ray", device="cpu", sync="cuda_ipc")  # type: ignore[arg-type]  # coerced
    with pytest.raises(ValidationError, match=r"layout.placement='separate'.*placement='colocate'"):
        LayoutConfig(kind="ray", device="gpu", placement="separate", sync="cuda_ipc")  # type: ignore[arg-type]  # coerced
    with pytest.raises(ValidationError, match=r"layout.sync='engine' with layout.kind='ray'"):
        LayoutConfig(kind="ray", sync="engine")  # type: ignore[arg-type]  # coerced
    with pytest.raises(TypeError, match="cannot move weights between Ray workers"):
        make_weight_sync(EngineSync(), Endpoint("rollout0", is_source=False, engine=object()))  # type: ignore[arg-type]  # never called
