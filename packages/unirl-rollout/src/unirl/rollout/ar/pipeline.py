"""``ARPipeline``: trainside text generation and teacher-forced replay for causal LMs.

Implements the rollout ``Pipeline`` protocol (``stage`` + ``generate(samples, rollout_step=)``)
and the AR replay contract (``replay_logprobs(parts) -> TokenReplay``).

Log-prob convention: each recorded token log-prob is ``log_softmax(logits / temperature)`` at the
sampled token — the temperature-scaled, *unfiltered* distribution; top-k / top-p restrict which
tokens can be drawn but are not renormalised into the log-prob. Replay computes the same
quantity, so the first-update ratio is exactly 1 (up to fp32 round-off).

Randomness: sample ``s`` at rollout step ``k`` draws from a CPU generator seeded with
``derive_seed(params.seed, k, s.id)``, one uniform per decode step, so its tokens do not depend
on the batch it shares, the batch order, or the device count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from torch import nn

from unirl.rollout.ar.bundle import CausalLMBundle
from unirl.rollout.ar.decode import decode
from unirl.rollout.ar.decode_static import decode_static
from unirl.rollout.ar.fused_decode import fusable
from unirl.rollout.ar.partial import PartialRollouts, decode_partial
from unirl.rollout.ar.replay import TokenReplay, replay_token_logprobs
from unirl.rollout.ar.sampling import derive_seed, draw_uniforms
from unirl.rollout.ar.segments import ar_params, fill_text_part, loss_mask, text_segment
from unirl.rollout.ar.stopping import cut_at_stop_string, first_stop
from unirl.types import ARSamplingParams, Part, Sample

_Job = tuple[Sample, Part, list[int]]


class ARPipeline:
    """Generates the text Part ``stage`` of each Sample with the bundle's causal LM.

    Args:
        bundle: model + tokenizer (the model is the training module itself: trainside sampling).
        params: default sampling params; a Part that already carries ARSamplingParams uses its own.
        stage: the Part name to fill (``"ar"``).
        parent: when set, the prompt is that earlier Part's text output instead of the Sample's
            first text input (e.g. a second turn).
        prompt_template: ``str.format`` template applied to the prompt text (``{prompt}``).
        stop_at_eos: also stop at the tokenizer's / generation config's EOS ids (recorded in the
            Part's ``sampling_params.stop_token_ids``).
        max_batch_size: decode at most this many samples at once (None: all of a params group).
        sync_every: decode steps between host syncs (all-finished and stop-string checks).
        lockstep_group: for sharded trainside sampling (FSDP): a process group, or ``"world"``,
            whose ranks run the same number of decode forwards (see ``decode``). Each rank must
            then pass the same number of samples with the same sampling params per call.
        decoder: ``"dynamic"`` (growing KV cache, any model), ``"static"`` (pre-allocated cache,
            fixed-shape step) or ``"graph"`` (static, with the step replayed as a CUDA graph on
            CUDA: the fast path for launch-bound batch decoding; see ``decode_static``) or
            ``"compiled"`` (``"graph"`` with the step through ``torch.compile``: fused kernels,
            faster on an H200 after a one-off compile per process and shape) or ``"fused"``
            (``"compiled"`` with ``FusedLM``'s forward: concatenated projections, Llama-family
            models without adapters; the fastest). All draw the same tokens from the same
            uniforms (compiled and fused: up to floating-point reassociation).
        kv_bucket: static decoders: attention reads the filled KV cache rounded up to a multiple
            of this many slots, one CUDA graph per bucket (0, the default: the whole cache, one
            graph; measured fastest in docs/benchmarks.md).
    """

    def __init__(
        self,
        bundle: CausalLMBundle,
        params: ARSamplingParams,
        *,
        stage: str = "ar",
        parent: str | None = None,
        prompt_template: str = "{prompt}",
        stop_at_eos: bool = True,
        max_batch_size: int | None = None,
        sync_every: int = 16,
        lockstep_group: Any = None,
        decoder: Literal["dynamic", "static", "graph", "compiled", "fused"] = "dynamic",
        kv_bucket: int = 0,
    ) -> None:
        if decoder in ("compiled", "fused") and kv_bucket:
            raise ValueError(
                f"decoder={decoder!r} reads the whole KV cache; got kv_bucket={kv_bucket}, use 0"
            )
        if decoder == "fused" and (reason := fusable(bundle.model)) is not None:
            raise ValueError(f"decoder='fused': {reason}; use decoder='compiled'")
        if decoder != "dynamic" and lockstep_group is not None:
            raise ValueError(
                f"decoder={decoder!r} cannot run lockstep (sharded) sampling; use decoder='dynamic' "
                "with lockstep_group"
            )
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1 (or None for no limit)")
        if "{prompt}" not in prompt_template:
            raise ValueError(
                f"prompt_template={prompt_template!r} must contain '{{prompt}}' (the sample's prompt)"
            )
        if sync_every < 1:
            raise ValueError(f"sync_every={sync_every} must be >= 1")
        self.bundle = bundle
        self.params = params
        self.stage = stage
        self.parent = parent
        self.prompt_template = prompt_template
        self.stop_at_eos = stop_at_eos
        self.max_batch_size = max_batch_size
        self.sync_every = sync_every
        self.lockstep_group = lockstep_group
        self.decoder = decoder
        self.kv_bucket = kv_bucket
        # The module the replay (and so every loss) runs through when it is not the decode model:
        # a backend that trains its own module (megatron) and keeps bundle.model as the rollout copy.
        self.replay_model: nn.Module | None = None
        self.partial: PartialRollouts | None = None

    def enable_partial(self, partial: PartialRollouts | None) -> None:
        """Partial rollouts (see ``unirl.rollout.ar.partial``): every generation is decoded in
        chunks and continued with newer weights when ``partial.swap`` has them; None turns it off."""
        if partial is not None and (self.decoder != "dynamic" or self.lockstep_group is not None):
            raise ValueError(
                f"partial rollouts need decoder='dynamic' without lockstep_group; this pipeline has "
                f"decoder={self.decoder!r}, lockstep_group={self.lockstep_group!r}"
            )
        self.partial = partial

    @property
    def model(self) -> nn.Module:
        """The causal LM (the training module; ``TrainsideEngine`` toggles its eval mode)."""
        return self.bundle.model

    # ---- generation --------------------------------------------------------------------------
    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Fill Part ``stage`` of every Sample (segment, text output, params, status); returns them."""
        groups: dict[str, tuple[ARSamplingParams, list[_Job]]] = {}
        for s in samples:
            part = s.ensure_part(self.stage, self.parent)
            params = self.effective_params(ar_params(part, self.params))
            groups.setdefault(params.model_dump_json(), (params, []))[1].append((s, part, self.prompt_ids(s)))
        model = self.bundle.model
        was_training = model.training
        model.eval()
        try:
            for params, jobs in groups.values():
                step = self.max_batch_size or len(jobs)
                for i in range(0, len(jobs), step):
                    self._generate_batch(jobs[i : i + step], params, rollout_step)
        finally:
            model.train(was_training)
        return samples

    def effective_params(self, params: ARSamplingParams) -> ARSamplingParams:
        """``params`` with the EOS ids added to ``stop_token_ids`` when ``stop_at_eos``."""
        if not self.stop_at_eos:
            return params
        ids = list(dict.fromkeys([*params.stop_token_ids, *self.bundle.eos_token_ids]))
        return params if ids == params.stop_token_ids else params.model_copy(update={"stop_token_ids": ids})

    def prompt_ids(self, sample: Sample) -> list[int]:
        """The prompt token ids of ``sample`` (template + tokenizer); ValueError if empty or too long."""
        text = sample.part(self.parent).text if self.parent is not None else sample.prompt
        if not text:
            raise ValueError(
                f"sample {sample.id!r}: the prompt text is empty ({text!r}); every sample needs a non-empty prompt"
            )
        ids = self.bundle.encode_prompt(self.prompt_template.format(prompt=text))
        ctx = self.bundle.context_window
        if not ids:
            raise ValueError(f"sample {sample.id!r}: prompt {text!r} encodes to no tokens")
        if len(ids) >= ctx:
            raise ValueError(
                f"sample {sample.id!r}: prompt is {len(ids)} tokens but the model's context window is {ctx} "
                "(prompt + at least one response token must fit); shorten or filter the prompt"
            )
        return ids

    def _generate_batch(self, jobs: Sequence[_Job], params: ARSamplingParams, rollout_step: int) -> None:
        ctx = self.bundle.context_window
        prompts = [ids for _, _, ids in jobs]
        limits = [min(params.max_new_tokens, ctx - len(ids)) for ids in prompts]
        seeds = [derive_seed(params.seed, rollout_step, s.id) for s, _, _ in jobs]
        stops = [x for x in params.stop if x]
        decode_text = self.bundle.decode

        def has_stop(ids: list[int]) -> bool:
            return first_stop(decode_text(ids), stops) is not None

        common: dict[str, Any] = dict(
            uniforms_BN=draw_uniforms(seeds, max(limits)),
            limits=limits,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            stop_token_ids=params.stop_token_ids,
            pad_token_id=self.bundle.pad_token_id,
            stop_check=has_stop if stops else None,
            sync_every=self.sync_every,
        )
        spans = None
        if self.partial is not None:
            out, spans = decode_partial(self.bundle.model, prompts, partial=self.partial, **common)
        elif self.decoder == "dynamic":
            out = decode(self.bundle.model, prompts, lockstep_group=self.lockstep_group, **common)
        else:
            out = decode_static(
                self.bundle.model,
                prompts,
                graph=self.decoder in ("graph", "compiled", "fused"),
                compile=self.decoder in ("compiled", "fused"),
                fused=self.decoder == "fused",
                pad_prompt_to=16,
                kv_bucket=self.kv_bucket,
                **common,
            )
        for b, (_, part, prompt_ids) in enumerate(jobs):
            n = int(out.lengths[b])
            response = out.tokens[b, :n].tolist()
            stopped = bool(out.stopped[b])
            cut = cut_at_stop_string(response, decode_text, stops) if stops else None
            if cut is not None:
                n, text = cut
                response, stopped = response[:n], True
            else:
                text = decode_text(response)
            finish: Literal["stop", "length"] = "stop" if stopped else "length"
            fill_text_part(
                part, prompt_ids=prompt_ids, response_ids=response, log_probs=out.logprobs[b, :n].clone(),
                text=text, finish=finish, params=params, versions=None if spans is None else spans[b],
            )  # fmt: skip

    # ---- replay ------------------------------------------------------------------------------
    def replay_logprobs(self, parts: Sequence[Part], *, with_entropy: bool = False) -> TokenReplay:
        """Teacher-forced log-probs ``[B, T]`` of the stored responses, with gradients.

        Uses each Part's recorded temperature. ``mask`` is the padded loss mask. ``with_entropy``
        also returns the per-token entropy of the tempered distribution (for logging or a bonus).
        """
        segs = [text_segment(p) for p in parts]
        temps = [ar_params(p, self.params).temperature for p in parts]
        logp, entropy = replay_token_logprobs(
            self.bundle.model if self.replay_model is None else self.replay_model,
            [s.prompt_ids for s in segs],
            [s.response_ids for s in segs],
            temps,
            pad_token_id=self.bundle.pad_token_id,
            with_entropy=with_entropy,
        )
        return TokenReplay(logp=logp, mask=loss_mask(parts, device=logp.device), entropy=entropy)
