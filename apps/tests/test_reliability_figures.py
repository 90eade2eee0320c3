"""The pure parts of scripts/reliability_figures.py: how measurements are counted for the figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rf() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "reliability_figures", ROOT / "scripts" / "reliability_figures.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reliability_figures", mod)
    spec.loader.exec_module(mod)
    return mod


def test_phase_of_names_every_kind_of_fault_point(rf: ModuleType) -> None:
    assert rf.phase_of("sft:3") == "SFT step"
    assert rf.phase_of("ckpt_write:7") == "ckpt files written"
    assert rf.phase_of("ckpt_swap:12") == "ckpt old moved aside"
    assert rf.phase_of("train_rank1:5") == rf.phase_of("train_rank0:2") == "train rank step"
    assert rf.phase_of("rollout_rank0:2") == "rollout worker generate"
    assert rf.phase_of("newkind:1") == "newkind"  # an unknown kind is shown as itself, not dropped


def test_aggregate_kills_counts_survived_and_tried_per_preset_and_phase(rf: ModuleType) -> None:
    sweeps = [
        {"preset": "ar", "launcher": "fork", "outcomes": [
            {"point": "sft:0", "ok": True}, {"point": "sft:2", "ok": False}, {"point": "trained:1", "ok": True}]},
        {"preset": "ar_ray", "launcher": "fork", "outcomes": [
            {"point": "train_rank1:5", "ok": True}, {"point": "train_rank0:6", "ok": True}]},
    ]  # fmt: skip
    assert rf.aggregate_kills(sweeps) == {
        "ar (fork)": {"SFT step": [1, 2], "after train step": [1, 1]},
        "ar_ray (fork)": {"train rank step": [2, 2]},
    }


def test_weightsync_nodes_map_to_fault_and_transport(rf: ModuleType) -> None:
    corr = "packages/unirl-distributed/tests/test_weightsync_corruption.py::"
    assert rf.sync_case(corr + "test_one_flipped_bit_is_detected[shared_memory-7]") == (
        "one bit flipped",
        "shared_memory",
    )
    assert rf.sync_case(
        corr + "test_bucket_dropped_from_ticket_is_detected_before_loading[3-tensor_buckets]"
    ) == (
        "bucket dropped from ticket",
        "tensor_buckets",
    )
    assert rf.sync_case(corr + "test_control_untouched_sync_loads_everything[tensor_buckets]") == (
        "control (no fault)",
        "tensor_buckets",
    )
    mail = "apps/tests/test_async_mailbox_corruption.py::"
    assert rf.sync_case(mail + "test_snapshot_missing_a_tensor_is_refused") == (
        "payload lost",
        "async_mailbox",
    )
    assert rf.sync_case(mail + "test_mailbox_refuses_a_version_that_does_not_increase") == (
        "stale / repeated version",
        "async_mailbox",
    )
    assert rf.sync_case(mail + "test_some_helper_check") is None


def test_tally_counts_passed_over_tried(rf: ModuleType) -> None:
    m = "apps/tests/test_recipe_mutations.py::"
    records = [
        {
            "nodeid": m + "test_mutation_rejected_before_any_model[typo:shapes_nft:rl.stpes=4]",
            "outcome": "passed",
        },
        {
            "nodeid": m + "test_mutation_rejected_before_any_model[typo:shapes_nft:rl.step=4]",
            "outcome": "failed",
        },
        {"nodeid": m + "test_mutation_rejected_before_any_model[range:a:b=0]", "outcome": "passed"},
        {"nodeid": m + "test_unmutated_recipe_reaches_the_build[shapes_nft]", "outcome": "passed"},
        {"nodeid": m + "test_mutation_mix", "outcome": "passed"},  # not a case: left out
    ]
    assert rf.tally(records, rf.mutation_case) == {
        "typo": {"": [1, 2]},
        "range": {"": [1, 1]},
        "control (unmutated)": {"": [1, 1]},
    }


def test_death_latencies_parses_each_tests_printed_measurement(rf: ModuleType) -> None:
    out = (
        "rollout worker killed: exited 3.8 s after the kill\n"
        "reward server killed: the run exited 5.8 s after the kill\n"
        "rollout worker hung: exited 24.4 s after it stopped (deadline 20 s)\n"
        "something else\n"
    )
    got = rf.death_latencies(out)
    assert got == {"rollout worker killed": 3.8, "reward server killed": 5.8, "rollout worker hung": 24.4}
    assert set(got) <= set(rf.DEATHS)  # every line the tests print has a component and a bound


def test_death_rows_keep_a_failed_test_as_a_row_without_a_time(rf: ModuleType) -> None:
    t = "apps/tests/test_component_death.py::"
    records = [
        {"nodeid": t + "test_rollout_worker_killed_mid_step_stops_the_run_naming_it", "outcome": "passed",
         "stdout": "rollout worker killed: exited 3.7 s after the kill\n"},
        {"nodeid": t + "test_train_rank_killed_mid_step_stops_the_run_naming_it", "outcome": "failed"},
    ]  # fmt: skip
    assert rf.death_rows(records) == [
        ("rollout worker\n(SIGKILL)", 3.7, 30.0, "passed"),
        ("train rank 1\n(SIGKILL)", None, 30.0, "failed"),
    ]
