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


@pytest.fixture(scope="module")
def rfs(rf: ModuleType) -> ModuleType:
    """scripts/reliability_figures_server.py (§3, §4, §6, §7), importing the ``rf`` loaded above."""
    spec = importlib.util.spec_from_file_location(
        "reliability_figures_server", ROOT / "scripts" / "reliability_figures_server.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ckpt_nodes_map_to_fault_and_format(rfs: ModuleType) -> None:
    t = "packages/unirl-train/tests/test_ckpt_faults.py::"
    disk, ro, rename = (c for _, c in rfs.CKPT_RULES)
    assert rfs.ckpt_case(t + "test_disk_full_at_every_write_keeps_the_previous_checkpoint[sharded]") == (
        disk,
        "sharded",
    )
    assert rfs.ckpt_case(t + "test_read_only_run_directory[full]") == (ro, "full")
    assert rfs.ckpt_case(t + "test_rename_failing_midway_leaves_a_complete_checkpoint") == (rename, "full")
    assert rfs.ckpt_case(t + "test_some_helper") is None


def test_bad_input_nodes_map_to_the_rows_of_section_6(rfs: ModuleType) -> None:
    r = "packages/unirl-reward/tests/"
    bad = (
        r + "test_server_bad_input.py::test_bad_request_is_4xx_naming_the_field_and_the_server_keeps_serving"
    )
    srv = r + "test_server.py::test_malformed_payloads_get_4xx_with_message"

    def case(nodeid: str) -> tuple[str, str] | None:
        return rfs.rule_case(nodeid, rfs.BAD_INPUT_RULES)

    assert case(bad + "[truncated JSON]") == (rfs.JSON_, "test_server_bad_input.py")
    assert case(bad + "[prompt a list]") == (rfs.TYPES, "test_server_bad_input.py")
    assert case(bad + "[items over the queue]") == (rfs.COUNT, "test_server_bad_input.py")
    assert (
        case(bad + "[JPEG labelled PNG]")
        == case(bad + "[image 2 channels]")
        == (rfs.IMAGE, "test_server_bad_input.py")
    )
    assert case(bad + "[video kind unknown]") == (rfs.VIDEO, "test_server_bad_input.py")
    assert case(srv + "[{not json-422-JSON]") == (rfs.JSON_, "test_server.py")
    assert case(srv + '[{"items": [{"response": 5}]}-422-response]') == (rfs.TYPES, "test_server.py")
    assert case(srv + "[payload9-413-max_request_bytes]") == (rfs.SIZE, "test_server.py")
    assert case(srv + '[{"items": [{"image": {"kind": "encoded"}}]}-422-cannot decode]') == (
        rfs.IMAGE,
        "test_server.py",
    )
    assert case(r + "test_server.py::test_finite_numbers_in_metadata_are_accepted") == (
        rfs.CONTROL,
        "test_server.py",
    )
    assert (
        case(r + "test_server.py::test_non_finite_numbers_anywhere_get_422_naming_the_path[x]")[0] == rfs.NAN
    )
    assert case(r + "test_schemathesis.py::test_server_keeps_its_published_contract")[0] == rfs.FUZZ
    # not an input: the schemathesis file's check of its own helper (its params mention an image)
    assert (
        case(r + "test_schemathesis.py::test_shape_refusals_are_told_apart[cannot decode the image-False]")
        is None
    )
    assert case(r + "test_server.py::test_concurrent_requests_are_batched_together") is None
    assert set(rfs.BAD_INPUT_ORDER) == {c for _, c in rfs.BAD_INPUT_RULES if c is not None}


def test_security_nodes_map_to_the_checks_of_section_7(rfs: ModuleType) -> None:
    sec = "packages/unirl-reward/tests/test_server_security.py::"
    srv = "packages/unirl-reward/tests/test_server.py::"
    cats = list(dict.fromkeys(c for _, c in rfs.SECURITY_RULES))

    def cat(nodeid: str) -> str | None:
        c = rfs.rule_case(nodeid, rfs.SECURITY_RULES)
        return None if c is None else c[0]

    assert cat(sec + "test_near_miss_tokens_get_401[Bearer s3cret-token-valu]") == cats[0]
    assert cat(srv + "test_auth_required_when_token_set") == cat(
        srv + "test_token_guards_every_path_but_the_probes"
    )
    bind = cat(sec + "test_public_bind_needs_a_token[None-0.0.0.0]")
    assert (
        bind
        == cat(srv + "test_cli_refuses_public_bind_without_token")
        == cat(sec + "test_serve_in_thread_refuses_a_public_bind_without_a_token")
    )
    assert cat(sec + "test_loopback_bind_needs_no_token[::1]") == cat(
        srv + "test_auth_off_on_loopback_by_default"
    )
    assert cat(srv + "test_retried_request_id_is_not_double_counted") is None


def test_scan_counts_split_allow_listed_from_not_allowed_and_keep_zeros(rfs: ModuleType) -> None:
    found = [
        ["a.py", "import_module(<computed name>)", [3, 9], "fixed table"],
        ["b.py", "import pickle", [1], None],
        ["c.py", "eval(", [4], None],
        ["d.py", "torch.load( without weights_only=True", [7], None],
    ]
    counts = rfs.scan_counts(found)
    assert list(counts) == list(dict.fromkeys(c for _, c in rfs.SCAN_RULES))  # every rule, in order
    by = dict(zip([frag for frag, _ in rfs.SCAN_RULES], counts.values()))
    assert by["import_module"] == [2, 0] and by["import "] == [0, 1] and by["("] == [0, 1]
    assert by["torch.load("] == [0, 1] and by["yaml."] == [0, 0]


def test_fuzz_summary_reads_the_line_schemathesis_prints(rfs: ModuleType) -> None:
    out = (
        "\nschemathesis: 479 requests to 5 paths (/health, /v1/score) with 8 methods; by status:"
        " {200: 82, 401: 69, 422: 254}\n"
    )
    records = [
        {"nodeid": "x::a", "outcome": "passed"},
        {"nodeid": "x::b", "outcome": "passed", "stdout": out},
    ]
    assert rfs.fuzz_summary(records) == (479, {200: 82, 401: 69, 422: 254})
    assert rfs.fuzz_summary(records[:1]) is None


def test_ordered_puts_the_sections_rows_first(rfs: ModuleType) -> None:
    assert list(rfs.ordered({"c": 1, "x": 2, "a": 3}, ["a", "b", "c"])) == ["a", "c", "x"]


def test_recorder_keeps_a_module_fixtures_teardown_output(rf: ModuleType) -> None:
    """schemathesis prints its counts when its module fixture is torn down, after the last call."""

    class Report:
        def __init__(self, when: str, out: str) -> None:
            self.nodeid, self.when, self.outcome, self.duration, self.capstdout = (
                "f::t",
                when,
                "passed",
                0.1,
                out,
            )

    rec = rf.Recorder()
    for when, out in [("setup", ""), ("call", "a\n"), ("teardown", "a\nschemathesis: 3 requests\n")]:
        rec.pytest_runtest_logreport(Report(when, out))
    assert rec.records == [
        {"nodeid": "f::t", "outcome": "passed", "seconds": 0.1, "stdout": "a\nschemathesis: 3 requests\n"}
    ]


def test_the_second_modules_subcommands_are_registered(rf: ModuleType, rfs: ModuleType) -> None:
    import argparse

    ap = argparse.ArgumentParser()
    rfs.add_commands(ap.add_subparsers(dest="cmd"))
    for cmd, (fn, _) in rfs.COMMANDS.items():
        assert ap.parse_args([cmd]).figure is fn
    assert {"checkpoint-faults", "source-scan", "server-bad-input", "server-security"} == set(rfs.COMMANDS)
