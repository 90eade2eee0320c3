"""``SGLangLLMEngine`` (kind ``sglang_llm``): a dedicated LLM rollout engine over an SGLang server.

Wire format (SGLang's native HTTP API):
- ``POST /generate`` with ``input_ids`` (our tokenizer and chat template encode the prompt, so the
  prompt ids trained on are exactly the ones sampled from), one ``sampling_params`` per sample
  (``sampling_seed`` derived from ``(seed, rollout_step, sample id)`` as in the trainside
  sampler) and ``return_logprob``. Each reply's ``meta_info.output_token_logprobs`` holds
  ``[logprob, token_id, text]`` per generated token; SGLang reports
  ``log_softmax(logits / temperature)`` before top-k / top-p, the same convention as
  ``unirl.rollout.ar`` (unless the server sets ``SGLANG_RETURN_ORIGINAL_LOGPROB``: don't).
  ``meta_info.finish_reason.type`` is ``stop`` / ``length`` / ``abort``.
- weight updates: see ``sglang_sync`` (distributed group, safetensors on disk, LoRA adapters);
- ``/release_memory_occupation`` and ``/resume_memory_occupation`` for ``sleep`` / ``wake_up``;
- ``/get_model_info`` (``weight_version``) and a canary prompt for verification after a sync.

After each sync the engine checks, and raises ``WeightSyncError`` otherwise: the stamp over what
it shipped equals the trainer's; the weights differ from the previous sync's (a no-op sync fails
loudly); the server reports the new ``weight_version`` (full-weight routes), or the canary
log-probs moved; optionally, the canary log-probs match the trainer's within a bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from unirl.distributed.errors import WeightSyncError
from unirl.rollout.ar.sampling import derive_seed
from unirl.rollout.ar.segments import fill_text_part
from unirl.rollout.ar.stopping import cut_at_stop_string
from unirl.rollout.engines.guards import check_weight_stamp, logprob_parity
from unirl.rollout.engines.http import EngineHTTPClient, EngineProtocolError, require
from unirl.rollout.engines.sglang_llm_config import (
    MemoryTag,
    SGLangDiskSync,
    SGLangDistributedSync,
    SGLangLLMEngineConfig,
    SGLangLoraSync,
)
from unirl.rollout.engines.sglang_sync import DiskRoute, DistributedRoute, LoraRoute
from unirl.types import ARSamplingParams, Part, Sample, WeightStamp

__all__ = [
    "PromptCodec",
    "SGLangDiskSync",
    "SGLangDistributedSync",
    "SGLangLLMEngine",
    "SGLangLLMEngineConfig",
    "SGLangLoraSync",
]


class PromptCodec(Protocol):
    """What the engine needs of the trainer's tokenizer (``CausalLMBundle`` provides it)."""

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def eos_token_ids(self) -> list[int]: ...


def parse_generate_item(item: Any, where: str) -> tuple[list[int], list[float], dict[str, Any], Any]:
    """``(response_ids, logprobs, finish_reason, weight_version)`` of one ``/generate`` reply item."""
    meta = require(item, "meta_info", dict, where)
    entries = require(meta, "output_token_logprobs", list, f"{where}.meta_info")
    ids, lps = [], []
    for k, e in enumerate(entries):
        if (
            not isinstance(e, list | tuple)
            or len(e) < 2
            or not isinstance(e[0], int | float)
            or not isinstance(e[1], int)
        ):
            raise EngineProtocolError(
                f"{where}.meta_info.output_token_logprobs[{k}] = {e!r}; expected [logprob, token_id, text]"
            )
        lps.append(float(e[0]))
        ids.append(int(e[1]))
    out_ids = item.get("output_ids")
    if out_ids is not None and list(out_ids) != ids:
        raise EngineProtocolError(
            f"{where}: output_ids ({len(out_ids)} tokens) differ from the tokens of output_token_logprobs "
            f"({len(ids)}); the server returned inconsistent outputs"
        )
    fr = meta.get("finish_reason")
    if fr is None:
        raise EngineProtocolError(f"{where}.meta_info.finish_reason is missing: the request did not finish")
    if isinstance(fr, str):
        fr = {"type": fr}
    if not isinstance(fr, dict) or fr.get("type") not in ("stop", "length", "abort"):
        raise EngineProtocolError(
            f"{where}.meta_info.finish_reason = {fr!r}; expected type stop/length/abort"
        )
    return ids, lps, fr, meta.get("weight_version")


class SGLangLLMEngine:
    """Dedicated LLM rollout engine over one SGLang server (see the module docstring).

    Args:
        client: HTTP client of the server.
        codec: the trainer's tokenizer side (``CausalLMBundle``): prompt encoding, decoding, EOS ids.
        params: default sampling params; a Part carrying ARSamplingParams uses its own.
        stage / parent / prompt_template / stop_at_eos: as ``ARPipeline``.
        route: how weights reach the server (None: the engine cannot be synced).
        initial_weight_version: version stamped on Parts before the first sync.
        canary_ids: a fixed token sequence scored after every sync (recommended; required with LoRA).
        canary_reference: ``ids -> [len(ids) - 1]`` log-probs of the canary under the trainer's
            weights; checked against the server's within ``canary_bound`` after each sync.
        sleep_tags: memory released by ``sleep`` (None: all).
        weights_survive_sleep: the server keeps a CPU backup of released weights
            (``--enable-weights-cpu-backup``); otherwise a sync must follow ``wake_up``.
        max_batch_size: samples per ``/generate`` request (None: all).
    """

    def __init__(
        self,
        client: EngineHTTPClient,
        codec: PromptCodec,
        params: ARSamplingParams,
        *,
        stage: str = "ar",
        parent: str | None = None,
        prompt_template: str = "{prompt}",
        stop_at_eos: bool = True,
        route: DistributedRoute | DiskRoute | LoraRoute | None = None,
        initial_weight_version: int = 0,
        canary_ids: Sequence[int] | None = None,
        canary_reference: Callable[[list[int]], Tensor] | None = None,
        canary_bound: float = 0.05,
        sleep_tags: Sequence[MemoryTag] | None = None,
        weights_survive_sleep: bool = False,
        max_batch_size: int | None = None,
    ) -> None:
        if "{prompt}" not in prompt_template:
            raise ValueError(f"prompt_template={prompt_template!r} must contain '{{prompt}}'")
        if isinstance(route, LoraRoute) and not canary_ids:
            raise ValueError(
                "LoRA weight sync needs canary_ids: the server reports no weight version for adapters, "
                "so only a canary log-prob can show that a sync changed what it samples"
            )
        if canary_ids is not None and len(canary_ids) < 2:
            raise ValueError(
                f"canary_ids needs >= 2 tokens (the first has no log-prob); got {list(canary_ids)}"
            )
        self.client, self.codec, self.params = client, codec, params
        self.stage, self.parent, self.prompt_template = stage, parent, prompt_template
        self.stop_at_eos, self.route = stop_at_eos, route
        self.weight_version = initial_weight_version
        self.canary_ids = list(canary_ids) if canary_ids is not None else None
        self.canary_reference, self.canary_bound = canary_reference, canary_bound
        self.sleep_tags = list(sleep_tags) if sleep_tags is not None else None
        self.weights_survive_sleep = weights_survive_sleep
        self.max_batch_size = max_batch_size
        self.asleep = False
        self._synced = False
        self._needs_sync: str | None = None
        self._last_checksum: str | None = None
        self._canary: Tensor | None = None
        self.last_sync_metrics: dict[str, float] = {}

    # ---- generation --------------------------------------------------------------------------
    def _effective(self, part: Part) -> ARSamplingParams:
        sp = part.sampling_params
        params = sp if isinstance(sp, ARSamplingParams) else self.params
        if not self.stop_at_eos:
            return params
        ids = list(dict.fromkeys([*params.stop_token_ids, *self.codec.eos_token_ids]))
        return params if ids == params.stop_token_ids else params.model_copy(update={"stop_token_ids": ids})

    @staticmethod
    def sampling_params(params: ARSamplingParams, seed: int) -> dict[str, Any]:
        """SGLang ``sampling_params`` for ``params`` (top_k 0 -> -1: SGLang's "disabled")."""
        return {
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "stop": list(params.stop),
            "stop_token_ids": list(params.stop_token_ids),
            "sampling_seed": seed,
            "skip_special_tokens": True,
        }

    def _lora_name(self) -> str | None:
        return self.route.active if isinstance(self.route, LoraRoute) else None

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Fill Part ``stage`` of every Sample from the server; returns the same Samples."""
        if self.asleep:
            raise RuntimeError(
                f"SGLang engine {self.client.url}: generate called while asleep; call wake_up()"
            )
        if self._needs_sync:
            raise RuntimeError(f"SGLang engine {self.client.url}: {self._needs_sync}")
        jobs = []
        for s in samples:
            part = s.ensure_part(self.stage, self.parent)
            text = s.part(self.parent).text if self.parent is not None else s.prompt
            ids = self.codec.encode_prompt(self.prompt_template.format(prompt=text))
            if not ids:
                raise ValueError(f"sample {s.id!r}: prompt {text!r} encodes to no tokens")
            jobs.append((s, part, self._effective(part), ids))
        step = self.max_batch_size or max(len(jobs), 1)
        for i in range(0, len(jobs), step):
            self._generate_batch(jobs[i : i + step], rollout_step)
        return samples

    def _generate_batch(
        self, jobs: list[tuple[Sample, Part, ARSamplingParams, list[int]]], rollout_step: int
    ) -> None:
        body: dict[str, Any] = {
            "input_ids": [ids for *_, ids in jobs],
            "sampling_params": [
                self.sampling_params(p, derive_seed(p.seed, rollout_step, s.id)) for s, _, p, _ in jobs
            ],
            "return_logprob": True,
        }
        lora = self._lora_name()
        if lora is not None:
            body["lora_path"] = [lora] * len(jobs)
        reply = self.client.post_json("/generate", body)
        if isinstance(reply, dict) and len(jobs) == 1:
            reply = [reply]
        if not isinstance(reply, list) or len(reply) != len(jobs):
            got = len(reply) if isinstance(reply, list) else type(reply).__name__
            raise EngineProtocolError(
                f"SGLang {self.client.url}/generate: {got} results for {len(jobs)} prompts"
            )
        for (s, part, params, prompt_ids), item in zip(jobs, reply):
            self._fill(s, part, params, prompt_ids, item)

    def _fill(
        self, s: Sample, part: Part, params: ARSamplingParams, prompt_ids: list[int], item: Any
    ) -> None:
        where = f"SGLang {self.client.url}/generate sample {s.id!r}"
        ids, lps, fr, served = parse_generate_item(item, where)
        full_weights = not isinstance(self.route, LoraRoute)  # adapters leave the base version alone
        if full_weights and self._synced and served is not None and str(served) != str(self.weight_version):
            raise WeightSyncError(
                f"{where}: sampled with server weight_version {served!r} but the engine last synced "
                f"v{self.weight_version}; another client updated the server, or the sync did not apply"
            )
        finish: Literal["stop", "length", "abort"] = fr["type"]
        text = self.codec.decode(ids)
        if finish == "stop" and isinstance(fr.get("matched"), str):
            cut = cut_at_stop_string(ids, self.codec.decode, [fr["matched"]])
            if cut is not None:
                n, text = cut
                ids, lps = ids[:n], lps[:n]
        fill_text_part(
            part,
            prompt_ids=prompt_ids,
            response_ids=ids,
            log_probs=lps,
            text=text,
            finish=finish,
            params=params,
        )
        part.weight_version = self.weight_version

    # ---- weights -----------------------------------------------------------------------------
    def canary_logprobs(self) -> Tensor:
        """``[len(canary_ids) - 1]`` fp32 log-probs of the canary tokens under the served weights."""
        if self.canary_ids is None:
            raise ValueError("no canary_ids configured")
        body: dict[str, Any] = {
            "input_ids": self.canary_ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        if self._lora_name() is not None:
            body["lora_path"] = self._lora_name()
        where = f"SGLang {self.client.url}/generate (canary)"
        meta = require(self.client.post_json("/generate", body), "meta_info", dict, where)
        entries = require(meta, "input_token_logprobs", list, where)
        lps = [float(e[0]) for e in entries if isinstance(e, list | tuple) and e and e[0] is not None]
        if len(lps) != len(self.canary_ids) - 1:
            raise EngineProtocolError(
                f"{where}: {len(lps)} input log-probs for {len(self.canary_ids)} canary tokens (expected n - 1)"
            )
        return torch.tensor(lps, dtype=torch.float32)

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], stamp: WeightStamp) -> WeightStamp:
        """Ship ``named_tensors`` through the route, then verify (module docstring). Returns the stamp."""
        where = f"SGLang engine {self.client.url}"
        if self.route is None:
            raise TypeError(f"{where} has no weight-sync route; configure weight_sync")
        if self.asleep:
            raise RuntimeError(f"{where}: update_weights while asleep; call wake_up() first")
        stamp.check_newer_than(self.weight_version if self._synced else None)
        if self.canary_ids is not None and self._canary is None:
            self._canary = self.canary_logprobs()
        self._needs_sync = f"the weight sync to v{stamp.version} failed; sync again before sampling"
        got = self.route.ship(named_tensors, stamp.version)
        check_weight_stamp(got, stamp, where)
        if got.checksum == self._last_checksum:
            raise WeightSyncError(
                f"{where}: weight sync v{stamp.version} carried exactly the weights of the previous sync "
                f"(checksum {got.checksum}); a no-op sync means the trainer's update did not change them"
            )
        self._verify(stamp.version)
        self._last_checksum, self.weight_version = got.checksum, stamp.version
        self._synced, self._needs_sync = True, None
        return got

    def _verify(self, version: int) -> None:
        where = f"SGLang engine {self.client.url} after sync v{version}"
        verified = False
        if not isinstance(self.route, LoraRoute):
            info = self.client.get_json("/get_model_info")
            served = info.get("weight_version") if isinstance(info, dict) else None
            if served is not None:
                if str(served) != str(version):
                    raise WeightSyncError(
                        f"{where}: server reports weight_version {served!r}, expected {version}"
                    )
                verified = True
        metrics: dict[str, float] = {}
        if self.canary_ids is not None:
            new = self.canary_logprobs()
            change = float((new - self._canary).abs().max()) if self._canary is not None else float("inf")
            if change == 0.0:
                raise WeightSyncError(
                    f"{where}: the canary log-probs did not change; the server still samples the old weights"
                )
            metrics["sync/canary_change"] = change
            if self.canary_reference is not None:
                ref = self.canary_reference(list(self.canary_ids))
                metrics.update(
                    logprob_parity(new, ref, max_abs_bound=self.canary_bound, sample_ids=["canary"])
                )
            self._canary = new
            verified = True
        if not verified:
            raise WeightSyncError(
                f"{where}: cannot verify the sync: the server reports no weight_version and no canary_ids are "
                "configured; set canary_ids"
            )
        self.last_sync_metrics = metrics

    # ---- memory ------------------------------------------------------------------------------
    def _memory(self, route: str) -> None:
        body = {"tags": self.sleep_tags} if self.sleep_tags is not None else {}
        reply = self.client.post_json(route, body, idempotent=False)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise RuntimeError(f"SGLang {self.client.url}{route} failed: {reply.get('message', reply)}")

    def sleep(self) -> None:
        """Release the server's GPU memory (``sleep_tags``); needs ``--enable-memory-saver`` on the server."""
        if self.asleep:
            return
        self._memory("/release_memory_occupation")
        self.asleep = True
        if not self.weights_survive_sleep and (self.sleep_tags is None or "weights" in self.sleep_tags):
            self._needs_sync = "the weights were released by sleep(); run a weight sync after wake_up()"
            self._last_checksum = None
            self._canary = None

    def wake_up(self) -> None:
        if not self.asleep:
            return
        self._memory("/resume_memory_occupation")
        self.asleep = False

    def close(self) -> None:
        """Close the weight route (e.g. its process group) and the HTTP client."""
        closer = getattr(self.route, "close", None)
        if callable(closer):
            closer()
        self.client.close()
