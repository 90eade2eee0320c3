"""SGLang LLM engine: a protocol contract test against a local HTTP server speaking SGLang's wire format.

The server below implements the documented request/reply shapes of SGLang's native routes
(``/generate`` with ``return_logprob``, ``/get_model_info``, ``/update_weights_from_disk``,
``/init_weights_update_group`` + ``/update_weights_from_distributed`` over a gloo group,
``/load_lora_adapter``, memory release/resume). It checks what the client sends and lets the
tests drive every reply; it says nothing about the real engine's numerics, which need the
``gpu``-marked live test at the bottom (``UNIRL_SGLANG_URL``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from unirl.distributed.collective import free_port
from unirl.distributed.errors import WeightSyncError
from unirl.rollout.ar import CausalLMBundle
from unirl.rollout.engines import RolloutEngine, SGLangLLMEngine, SGLangLLMEngineConfig, weight_stamp
from unirl.rollout.engines.http import EngineHTTPClient, EngineHTTPError, EngineProtocolError, EngineRetry
from unirl.rollout.engines.sglang_sync import (
    DiskRoute,
    DistributedRoute,
    LoraRoute,
    new_weight_update_group,
    peft_key,
)
from unirl.rollout.engines.testing import WireServer
from unirl.types import ARSamplingParams, Sample, TextPrimitive


class FakeSGLang:
    """SGLang server state: served weights and version, adapters, memory; scripted generations."""

    def __init__(self, tmp: Path) -> None:
        self.version: str = "default"
        self.weights: dict[str, torch.Tensor] = {}
        self.loras: dict[str, Path] = {}
        self.released: list[Any] = []
        self.group: Any = None
        self.script: Callable[[list[int], dict[str, Any], int], dict[str, Any]] = self.echo_script
        self.ignore_weight_updates = False
        self.server = WireServer(
            {
                "/generate": self.generate,
                "/get_model_info": lambda b: (200, {"model_path": "m", "weight_version": self.version}),
                "/update_weights_from_disk": self.from_disk,
                "/init_weights_update_group": self.init_group,
                "/update_weights_from_distributed": self.from_distributed,
                "/load_lora_adapter": self.load_lora,
                "/unload_lora_adapter": self.unload_lora,
                "/release_memory_occupation": lambda b: (200, self.released.append(("release", b)) or {}),
                "/resume_memory_occupation": lambda b: (200, self.released.append(("resume", b)) or {}),
                "/health": lambda b: (200, {}),
            }
        )

    def weight_signal(self) -> float:
        """A number that moves with the served weights and adapters (drives canary log-probs)."""
        s = sum(float(t.float().sum()) for t in self.weights.values())
        return (
            s + 0.01 * len(self.loras) + sum(float(p.stat().st_mtime_ns % 997) for p in self.loras.values())
        )

    @staticmethod
    def echo_script(ids: list[int], sp: dict[str, Any], i: int) -> dict[str, Any]:
        # response: tokens 20, 21, 22 then EOS(2) when it is a stop token and budget allows
        out = [20, 21, 22]
        eos = 2 in sp["stop_token_ids"] and sp["max_new_tokens"] > 3
        out = ([*out, 2] if eos else out)[: sp["max_new_tokens"]]
        fr = {"type": "stop", "matched": 2} if eos else {"type": "length", "length": len(out)}
        return {"ids": out, "lps": [-0.5 - 0.1 * k for k in range(len(out))], "finish_reason": fr}

    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("logprob_start_len") == 0:  # canary scoring
            ids = body["input_ids"]
            sig = self.weight_signal()
            lps = [None] + [-1.0 - 0.001 * k - sig * 1e-3 for k in range(1, len(ids))]
            return 200, {
                "text": "",
                "meta_info": {"input_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]},
            }
        items = []
        for i, (ids, sp) in enumerate(zip(body["input_ids"], body["sampling_params"])):
            r = self.script(ids, sp, i)
            meta = {
                "id": f"r{i}",
                "finish_reason": r["finish_reason"],
                "prompt_tokens": len(ids),
                "completion_tokens": len(r["ids"]),
                "weight_version": self.version,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(r["lps"], r["ids"])],
            }
            items.append({"text": "x", "output_ids": r["ids"], "meta_info": meta})
        return 200, items

    def from_disk(self, body: dict[str, Any]) -> tuple[int, Any]:
        from safetensors.torch import load_file

        path = Path(body["model_path"])
        files = sorted(path.glob("*.safetensors"))
        if not files:
            return 200, {"success": False, "message": f"no safetensors in {path}"}
        if not self.ignore_weight_updates:
            for f in files:
                self.weights.update(load_file(str(f)))
            self.version = body["weight_version"]
        return 200, {"success": True, "message": "ok", "num_paused_requests": 0}

    def init_group(self, body: dict[str, Any]) -> tuple[int, Any]:
        assert body["rank_offset"] == 1 and body["world_size"] == 2
        self.group = new_weight_update_group(
            body["backend"],
            body["master_address"],
            body["master_port"],
            1,
            2,
            body["group_name"],
            30.0,
            register_as=body["group_name"] + "-server",  # both ends live in this test process
        )
        return 200, {"success": True, "message": "ok"}

    def from_distributed(self, body: dict[str, Any]) -> tuple[int, Any]:
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
            t = torch.empty(shape, dtype=getattr(torch, dtype))
            self.group.broadcast([t], opts).wait()
            self.weights[name] = t
        if body.get("weight_version") is not None:
            self.version = body["weight_version"]
        return 200, {"success": True, "message": "ok"}

    def load_lora(self, body: dict[str, Any]) -> tuple[int, Any]:
        path = Path(body["lora_path"])
        cfg = json.loads((path / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA" and (path / "adapter_model.safetensors").is_file()
        self.loras[body["lora_name"]] = path
        return 200, {"success": True, "loaded_adapters": {n: str(p) for n, p in self.loras.items()}}

    def unload_lora(self, body: dict[str, Any]) -> tuple[int, Any]:
        self.loras.pop(body["lora_name"])
        return 200, {"success": True}


@pytest.fixture(scope="module")
def bundle() -> CausalLMBundle:
    return CausalLMBundle.tiny_qwen3(seed=0)


@pytest.fixture
def fake(tmp_path: Path):  # type: ignore[no-untyped-def]
    f = FakeSGLang(tmp_path)
    yield f
    f.server.close()


def client(url: str, **kw: Any) -> EngineHTTPClient:
    return EngineHTTPClient(url, retry=EngineRetry(max_attempts=2, backoff_s=0.01), **kw)


def params(**kw: Any) -> ARSamplingParams:
    return ARSamplingParams(**{"max_new_tokens": 8, "temperature": 0.7, "top_k": 0, "seed": 3, **kw})


def batch(n: int = 2) -> list[Sample]:
    return [Sample(id=f"s{i}", group_id="g", inputs=[TextPrimitive(text=f"1+{i}=")]) for i in range(n)]


def test_generate_builds_sglang_request_and_parses_text_segments(fake, bundle) -> None:  # type: ignore[no-untyped-def]
    eng = SGLangLLMEngine(client(fake.server.url, api_key="k"), bundle, params(), initial_weight_version=5)
    assert isinstance(eng, RolloutEngine)
    out = eng.generate(batch(2), rollout_step=4)
    path, body, headers = fake.server.calls[-1]
    assert path == "/generate" and headers["Authorization"] == "Bearer k" and body["return_logprob"] is True
    assert body["input_ids"][1] == bundle.encode_prompt(
        "1+1="
    )  # our tokenizer and template, not the server's
    sp = body["sampling_params"][0]
    assert sp["top_k"] == -1 and sp["temperature"] == 0.7 and 2 in sp["stop_token_ids"]
    assert sp["sampling_seed"] != body["sampling_params"][1]["sampling_seed"]  # per sample
    seg = out[0].part("ar").segment
    assert seg.response_ids == [20, 21, 22, 2] and seg.finish_reason == "stop"
    assert torch.allclose(seg.log_probs, torch.tensor([-0.5, -0.6, -0.7, -0.8]))
    assert seg.log_probs.dtype == torch.float32 and seg.prompt_ids == bundle.encode_prompt("1+0=")
    part = out[0].part("ar")
    assert (
        part.status == "completed" and part.weight_version == 5 and part.text == bundle.decode([20, 21, 22])
    )


def test_length_finish_and_stop_string_cut(fake, bundle) -> None:  # type: ignore[no-untyped-def]
    eng = SGLangLLMEngine(client(fake.server.url), bundle, params(max_new_tokens=3))
    part = eng.generate(batch(1), rollout_step=0)[0].part("ar")
    assert part.segment.finish_reason == "length" and part.status == "truncated"
    stop_text = bundle.decode([21])

    def stop_script(ids: list[int], sp: dict[str, Any], i: int) -> dict[str, Any]:
        assert sp["stop"] == [stop_text]
        return {
            "ids": [20, 21, 22],
            "lps": [-1.0, -2.0, -3.0],
            "finish_reason": {"type": "stop", "matched": stop_text},
        }

    fake.script = stop_script
    eng = SGLangLLMEngine(client(fake.server.url), bundle, params(stop=[stop_text]))
    part = eng.generate(batch(1), rollout_step=0)[0].part("ar")
    # cut at the token that completes the stop string (kept, as in ARPipeline); text excludes it
    assert part.segment.response_ids == [20, 21] and part.segment.log_probs.tolist() == [-1.0, -2.0]
    assert part.text == bundle.decode([20])


def test_malformed_replies_raise_protocol_errors(fake, bundle) -> None:  # type: ignore[no-untyped-def]
    eng = SGLangLLMEngine(client(fake.server.url), bundle, params())
    fake.server.routes["/generate"] = lambda b: (200, [{"meta_info": {}}] * 2)
    with pytest.raises(EngineProtocolError, match="output_token_logprobs' is missing"):
        eng.generate(batch(2), rollout_step=0)
    fake.server.routes["/generate"] = lambda b: (200, [])
    with pytest.raises(EngineProtocolError, match="0 results for 2 prompts"):
        eng.generate(batch(2), rollout_step=0)
    fake.server.routes["/generate"] = lambda b: (200, b"not json")
    with pytest.raises(EngineProtocolError, match="not JSON"):
        eng.generate(batch(2), rollout_step=0)


def test_5xx_unreachable_and_timeout_are_bounded_errors(fake, bundle) -> None:  # type: ignore[no-untyped-def]
    fake.server.routes["/generate"] = lambda b: (503, {"detail": "overloaded"})
    eng = SGLangLLMEngine(client(fake.server.url), bundle, params())
    with pytest.raises(EngineHTTPError, match="after 2 attempts: HTTP 503: overloaded"):
        eng.generate(batch(1), rollout_step=0)
    assert fake.server.paths().count("/generate") == 2  # retried once, then gave up
    fake.server.routes["/generate"] = lambda b: (400, {"detail": "bad sampling_params"})
    with pytest.raises(EngineHTTPError, match="HTTP 400: bad sampling_params") as e:
        eng.generate(batch(1), rollout_step=0)
    assert e.value.status == 400
    dead = SGLangLLMEngine(client(f"http://127.0.0.1:{free_port()}"), bundle, params())
    with pytest.raises(EngineHTTPError, match="unreachable"):
        dead.generate(batch(1), rollout_step=0)
    release = threading.Event()
    fake.server.routes["/generate"] = lambda b: (200, release.wait(10) and [])
    slow = SGLangLLMEngine(client(fake.server.url, timeout_s=0.3), bundle, params())
    try:
        with pytest.raises(EngineHTTPError, match="timed out"):
            slow.generate(batch(1), rollout_step=0)
    finally:
        release.set()


def named(scale: float) -> list[tuple[str, torch.Tensor]]:
    return [("model.w", torch.full((2, 3), scale)), ("model.b", torch.arange(3.0) * scale)]


def test_disk_sync_verifies_version_canary_and_rejects_noop(fake, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = client(fake.server.url)
    eng = SGLangLLMEngine(
        c,
        bundle,
        params(),
        route=DiskRoute(c, directory=tmp_path / "w"),
        canary_ids=bundle.encode_prompt("canary"),
    )
    got = eng.update_weights(named(1.0), weight_stamp(named(1.0), 1))
    assert got == weight_stamp(named(1.0), 1) and fake.version == "1" and eng.weight_version == 1
    assert torch.equal(fake.weights["model.w"], torch.ones(2, 3))
    assert eng.last_sync_metrics["sync/canary_change"] > 0
    assert eng.generate(batch(1), rollout_step=1)[0].part("ar").weight_version == 1
    with pytest.raises(WeightSyncError, match="no-op sync"):
        eng.update_weights(named(1.0), weight_stamp(named(1.0), 2))
    with pytest.raises(RuntimeError, match="sync again"):
        eng.generate(batch(1), rollout_step=2)
    with pytest.raises(ValueError, match="stamp mismatch"):  # the trainer stamped other tensors
        eng.update_weights(named(2.0), weight_stamp(named(3.0), 3))
    eng.update_weights(named(4.0), weight_stamp(named(4.0), 4))
    with pytest.raises(ValueError, match="not newer"):
        eng.update_weights(named(5.0), weight_stamp(named(5.0), 4))
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["unirl-v4"]  # keep_last=1


def test_sync_the_server_ignored_fails_loudly(fake, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake.ignore_weight_updates = True  # answers success but keeps serving the old weights
    c = client(fake.server.url)
    eng = SGLangLLMEngine(
        c, bundle, params(), route=DiskRoute(c, directory=tmp_path), canary_ids=bundle.encode_prompt("c")
    )
    with pytest.raises(WeightSyncError, match="weight_version 'default', expected 1"):
        eng.update_weights(named(1.0), weight_stamp(named(1.0), 1))
    fake.server.routes["/get_model_info"] = lambda b: (200, {"model_path": "m"})  # older servers: no version
    with pytest.raises(WeightSyncError, match="canary log-probs did not change"):
        eng.update_weights(named(2.0), weight_stamp(named(2.0), 2))


def test_another_writer_changing_the_served_version_is_caught(fake, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = client(fake.server.url)
    eng = SGLangLLMEngine(c, bundle, params(), route=DiskRoute(c, directory=tmp_path))
    eng.update_weights(named(1.0), weight_stamp(named(1.0), 1))
    fake.version = "9"
    with pytest.raises(WeightSyncError, match="server weight_version '9'"):
        eng.generate(batch(1), rollout_step=0)


GROUP_SERVER = r"""
import json, sys, threading, torch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unirl.rollout.engines.sglang_sync import new_weight_update_group

state = {"group": None, "version": "default", "weights": {}}

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self._reply({"weight_version": state["version"],
                     "weights": {n: [str(t.dtype), t.float().tolist()] for n, t in state["weights"].items()}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/init_weights_update_group":
            assert body["rank_offset"] == 1 and body["world_size"] == 2, body
            state["group"] = new_weight_update_group(
                body["backend"], body["master_address"], body["master_port"], 1, 2, body["group_name"], 30.0)
        else:
            opts = torch.distributed.BroadcastOptions()
            opts.rootRank = 0
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                state["group"].broadcast([t], opts).wait()
                state["weights"][name] = t
            if body.get("weight_version") is not None:
                state["version"] = body["weight_version"]
        self._reply({"success": True, "message": "ok"})

    def _reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass

httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(httpd.server_address[1], flush=True)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
sys.stdin.read()  # serve until the test closes our stdin
"""


@pytest.mark.slow
def test_distributed_sync_broadcasts_over_a_group(bundle) -> None:  # type: ignore[no-untyped-def]
    """The server end runs in its own process (as SGLang does): a gloo group, one broadcast per tensor."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", GROUP_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"  # type: ignore[union-attr]
        c = client(url)
        route = DistributedRoute(c, engine_world_size=1, backend="gloo", bucket_bytes=30, timeout_s=60.0)
        eng = SGLangLLMEngine(c, bundle, params(), route=route)
        tensors = [*named(1.5), ("model.h", torch.arange(4, dtype=torch.bfloat16))]
        eng.update_weights(tensors, weight_stamp(tensors, 1))
        served = c.get_json("/get_model_info")
        assert served["weight_version"] == "1"
        for name, t in tensors:
            dtype, values = served["weights"][name]
            assert dtype == str(t.dtype) and values == t.float().tolist()
        eng.update_weights(named(2.0), weight_stamp(named(2.0), 2))  # the group is reused
        served = c.get_json("/get_model_info")
        assert served["weight_version"] == "2" and served["weights"]["model.w"][1] == [[2.0] * 3] * 2
        eng.close()
        assert route.group is None
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(30)


def test_distributed_sync_buckets_and_refusal(fake, bundle) -> None:  # type: ignore[no-untyped-def]
    """Request side only: a server that refuses the group leaves the engine unsyncable, loudly."""
    fake.server.routes["/init_weights_update_group"] = lambda b: (
        200,
        {"success": False, "message": "no NCCL"},
    )
    c = client(fake.server.url)
    route = DistributedRoute(c, engine_world_size=1, backend="gloo", timeout_s=5.0)
    eng = SGLangLLMEngine(c, bundle, params(), route=route)
    with pytest.raises(WeightSyncError, match="refused the update: no NCCL"):
        eng.update_weights(named(1.0), weight_stamp(named(1.0), 1))
    body = fake.server.calls[-1][1]
    assert body["rank_offset"] == 1 and body["world_size"] == 2 and body["backend"] == "gloo"


def test_lora_sync_loads_fresh_names_and_unloads_the_previous(fake, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = client(fake.server.url)
    route = LoraRoute(c, directory=tmp_path, rank=2, alpha=4.0, target_modules=["q_proj"])
    with pytest.raises(ValueError, match="needs canary_ids"):
        SGLangLLMEngine(c, bundle, params(), route=route)
    eng = SGLangLLMEngine(c, bundle, params(), route=route, canary_ids=bundle.encode_prompt("c"))
    ad = [("base_model.model.layers.0.q_proj.lora_A.default.weight", torch.ones(2, 4))]
    eng.update_weights(ad, weight_stamp(ad, 1))
    ad2 = [("base_model.model.layers.0.q_proj.lora_A.default.weight", torch.full((2, 4), 2.0))]
    eng.update_weights(ad2, weight_stamp(ad2, 2))
    assert list(fake.loras) == ["unirl-v2"] and not (tmp_path / "unirl-v1").exists()
    eng.generate(batch(1), rollout_step=0)
    assert fake.server.calls[-1][1]["lora_path"] == ["unirl-v2"]
    with pytest.raises(ValueError, match="non-adapter tensor"):
        eng.update_weights(named(3.0), weight_stamp(named(3.0), 3))
    assert peft_key("x.lora_B.default.weight") == "x.lora_B.weight"
    assert peft_key("x.lora_embedding_A.default") == "x.lora_embedding_A"


def test_sleep_releases_memory_and_demands_a_sync_after_wake(fake, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = client(fake.server.url)
    eng = SGLangLLMEngine(c, bundle, params(), route=DiskRoute(c, directory=tmp_path))
    eng.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate(batch(1), rollout_step=0)
    eng.wake_up()
    assert fake.released == [("release", {}), ("resume", {})]
    with pytest.raises(RuntimeError, match="released by sleep"):
        eng.generate(batch(1), rollout_step=0)
    eng.update_weights(named(1.0), weight_stamp(named(1.0), 1))
    eng.generate(batch(1), rollout_step=0)
    kv = SGLangLLMEngine(c, bundle, params(), sleep_tags=["kv_cache"])
    kv.sleep()
    kv.wake_up()
    kv.generate(batch(1), rollout_step=0)  # weights kept: no sync needed
    assert fake.released[-1] == ("resume", {"tags": ["kv_cache"]})


def test_config_builds_engine_with_discriminated_sync(fake, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = SGLangLLMEngineConfig.model_validate(
        {
            "url": fake.server.url,
            "sampling": {"max_new_tokens": 4},
            "weight_sync": {"mode": "disk", "directory": str(tmp_path)},
            "health_timeout_s": 5,
        }
    )
    eng = cfg.build(bundle)
    assert isinstance(eng.route, DiskRoute) and eng.canary_ids
    eng.update_weights(named(1.0), weight_stamp(named(1.0), 1))
    with pytest.raises(ValueError, match="mode"):
        SGLangLLMEngineConfig.model_validate(
            {"url": "http://x", "sampling": {"max_new_tokens": 1}, "weight_sync": {"mode": "nccl"}}
        )


@pytest.mark.gpu
@pytest.mark.skipif(
    not os.environ.get("UNIRL_SGLANG_URL"), reason="needs a live SGLang server: UNIRL_SGLANG_URL"
)
def test_live_sglang_generate_logprobs_match_trainer() -> None:
    """Against a real server serving UNIRL_SGLANG_MODEL: engine log-probs match a transformers replay."""
    from unirl.rollout.ar import replay_token_logprobs

    bundle = CausalLMBundle.from_pretrained(os.environ["UNIRL_SGLANG_MODEL"], dtype="bfloat16", device="cuda")
    eng = SGLangLLMEngineConfig(url=os.environ["UNIRL_SGLANG_URL"], sampling=params(max_new_tokens=32)).build(
        bundle
    )
    parts = [s.part("ar") for s in eng.generate(batch(4), rollout_step=0)]
    segs = [p.segment for p in parts]
    with torch.no_grad():
        logp, _ = replay_token_logprobs(
            bundle.model,
            [s.prompt_ids for s in segs],
            [s.response_ids for s in segs],
            [0.7] * 4,
            pad_token_id=bundle.pad_token_id,
        )
    from unirl.rollout.engines import logprob_parity

    rows = [logp[i, : len(s.response_ids)].cpu() for i, s in enumerate(segs)]
    logprob_parity([s.log_probs for s in segs], rows, max_abs_bound=0.1)
