"""``FlowMatchPipeline``: sampling with per-step log-probs, and replay of a stored step.

One pipeline serves rollout and training, so both run the same SDE kernel on the same pinned
sigmas, eta, guidance scale and negative prompt:

- ``generate`` pins the sigma schedule on the Part's sampling params, encodes prompts once
  (conditions, with ``negative_*`` twins under CFG, are stored on the Part), draws x_T from
  ``(seed, sample or group id)``, runs the SDE on ``resolve_sde_indices(rollout_step)`` and the ODE
  elsewhere, and stores exactly the latents replay needs (x_j, x_{j+1} per SDE step, plus the final
  latent) with one log-prob per SDE step.
- Video: with ``sampling_params.num_frames`` set, the bundle must be a ``VideoFlowBundle``; latents
  are ``[B, C, F, h, w]`` (the same SDE kernels and replay: they are elementwise), x_T and the SDE
  noise are drawn frame-aware (``unirl.rollout.noise.FrameNoise``), and the Part's output is a
  ``VideoPrimitive`` of uint8 frames ``[F, H, W, 3]``.
- ``replay_step`` re-scores the stored transition x_j -> x_{j+1} with gradients on the transformer.
  On an unchanged policy with the same micro-batch shape it reproduces the stored log-prob (ratio 1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from unirl.rollout.models.base import (
    NEGATIVE_PREFIX,
    FlowBundle,
    VideoFlowBundle,
    classic_cfg,
    pad_to_length,
    stack_conditions,
)
from unirl.rollout.noise import FrameNoise, initial_noise, noise_generator, noise_key, sde_noise_key
from unirl.rollout.schedules import static_shifted_sigmas
from unirl.rollout.sde import SDEStrategy, StepResult, get_strategy, ode_step
from unirl.types import (
    Conditions,
    DiffusionSamplingParams,
    ImagePrimitive,
    LatentTrajectory,
    Part,
    Sample,
    VideoPrimitive,
    to_torch,
)

__all__ = ["FlowMatchPipeline", "StepReplay", "latent_shape", "pin_sigmas"]


@dataclass
class StepReplay:
    """One replayed denoising step j for a micro-batch of B parts (all fp32, with gradients)."""

    log_prob: Tensor | None
    """[B] mean-over-elements log-prob of the stored x_{j+1}; None when the step is deterministic (eta 0)."""
    mean: Tensor
    """[B, ...] the Gaussian mean mu_theta."""
    std: Tensor
    """[B] the step std s."""
    velocity: Tensor
    """[B, ...] the guided velocity prediction."""


def _video_bundle(params: DiffusionSamplingParams, bundle: FlowBundle) -> VideoFlowBundle:
    if not isinstance(bundle, VideoFlowBundle):
        raise TypeError(
            f"sampling_params.num_frames={params.num_frames} asks for a video, but {type(bundle).__name__} "
            "is an image model (not a VideoFlowBundle): set num_frames=null or load a video model"
        )
    return bundle


def latent_shape(params: DiffusionSamplingParams, bundle: FlowBundle) -> tuple[int, ...]:
    """Per-sample latent shape: ``(C, h, w)`` for an image, ``(C, F, h, w)`` when ``params.num_frames``."""
    if params.num_frames is None:
        return tuple(bundle.latent_shape(params.height, params.width))
    video = _video_bundle(params, bundle)
    return tuple(video.video_latent_shape(params.height, params.width, params.num_frames))


def _seq_len(params: DiffusionSamplingParams, bundle: FlowBundle) -> int:
    if params.num_frames is None:
        return bundle.image_seq_len(params.height, params.width)
    return _video_bundle(params, bundle).video_seq_len(params.height, params.width, params.num_frames)


def pin_sigmas(params: DiffusionSamplingParams, bundle: FlowBundle) -> DiffusionSamplingParams:
    """``params`` with its T + 1 sigmas filled (unchanged when already pinned, e.g. echoed by an engine)."""
    if params.sigmas is not None:
        return params
    if params.dynamic_shift:
        sigmas = bundle.dynamic_schedule.sigmas(params.num_steps, _seq_len(params, bundle))
    else:
        sigmas = static_shifted_sigmas(params.num_steps, params.shift)
    return params.model_copy(update={"sigmas": sigmas})


class FlowMatchPipeline:
    """Sampling + replay for any ``FlowBundle`` (SD3, FLUX, ...); see the module docstring.

    Args:
        bundle: the model.
        stage: name of the Part this pipeline fills.
        default_params: sampling params for Parts that carry none.
        prompt_part: take the prompt from this earlier Part's text (prompt enhancer), not the Sample's input.
        max_batch_size: largest batch per forward (CFG doubles it); None = all samples at once.
        record_old_means: store the rollout Gaussian means (FlowDPPO needs them).
        rollout_autograd: run the rollout's model forwards with autograd recording (outputs
            detached, nothing back-propagated). A compiled model then runs the same kernels in
            rollout as in training replay (an inference-mode graph is compiled and fused
            differently), which keeps the first-update ratio exactly 1 in bf16; eager models
            need no such help. Costs the forward's saved activations, freed after each step.
    """

    def __init__(
        self,
        bundle: FlowBundle,
        *,
        stage: str = "diffusion",
        default_params: DiffusionSamplingParams | None = None,
        prompt_part: str | None = None,
        max_batch_size: int | None = None,
        record_old_means: bool = False,
        rollout_autograd: bool = False,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        self.bundle = bundle
        self.stage = stage
        self.default_params = default_params
        self.prompt_part = prompt_part
        self.max_batch_size = max_batch_size
        self.record_old_means = record_old_means
        self.rollout_autograd = rollout_autograd
        self._negative_cache: dict[str, Conditions] = {}

    # ---- rollout ------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, samples: list[Sample], *, rollout_step: int) -> list[Sample]:
        """Fill the ``stage`` Part of each Sample (see the module docstring). Returns ``samples``."""
        groups: dict[str, list[tuple[Sample, Part, DiffusionSamplingParams]]] = {}
        for s in samples:
            part = s.ensure_part(self.stage, parent=self.prompt_part)
            params = part.sampling_params if part.sampling_params is not None else self.default_params
            if not isinstance(params, DiffusionSamplingParams):
                raise TypeError(
                    f"sample {s.id!r} part {self.stage!r}: sampling_params must be DiffusionSamplingParams "
                    f"(set it on the Part or pass default_params=); got {type(params).__name__}"
                )
            params = pin_sigmas(params, self.bundle)
            groups.setdefault(params.model_dump_json(), []).append((s, part, params))
        for members in groups.values():
            step = self.max_batch_size or len(members)
            for i in range(0, len(members), step):
                self._generate_batch(members[i : i + step], rollout_step)
        return samples

    def _generate_batch(
        self, members: list[tuple[Sample, Part, DiffusionSamplingParams]], rollout_step: int
    ) -> None:
        params = members[0][2]
        assert params.sigmas is not None
        strategy = get_strategy(params.sde_strategy)
        sde_indices = params.resolve_sde_indices(rollout_step)
        strategy.check(params.sigmas, sde_indices, params.eta)
        scored = strategy.stochastic and params.eta > 0
        B, T, dev = len(members), params.num_steps, self.bundle.device

        conditions = self._encode(members, params)
        shape = latent_shape(params, self.bundle)
        video = params.num_frames is not None
        keys = [noise_key(s.id, s.group_id, params.noise.scope) for s, _, _ in members]
        sde_keys = [sde_noise_key(s.id, s.group_id, params.noise.scope) for s, _, _ in members]
        frame_axis = 1 if video else None  # [C, F, h, w]
        x = initial_noise(shape, seed=params.noise.seed, keys=keys, frame_axis=frame_axis).to(dev)
        step_gens: list[torch.Generator] | list[FrameNoise] = (
            [FrameNoise(params.noise.seed, k, shape, 1, stream="sde") for k in sde_keys]
            if video
            else [noise_generator(params.noise.seed, k, stream="sde") for k in sde_keys]
        )
        sigmas = torch.tensor(params.sigmas, dtype=torch.float32, device=dev).expand(B, T + 1)

        pos, neg = self._stack(conditions, params.guidance_scale)
        keep = sorted({p for j in sde_indices for p in (j, j + 1)} | {T})
        x, stored, log_probs, means = self._denoise(
            x, sigmas, params, strategy, set(sde_indices), keep, pos, neg, step_gens
        )

        media = self.bundle.decode(x)  # uint8 [B, H, W, 3], or [B, F, H, W, 3] for a video
        lp = torch.stack(log_probs, dim=1) if scored and sde_indices else None  # [B, n]
        om = torch.stack(means, dim=1) if means else None  # [B, n, ...]
        lat = torch.stack([stored[p] for p in keep], dim=1)  # [B, S, ...]
        for b, (_, part, _) in enumerate(members):
            part.sampling_params = params
            part.conditions = conditions[b]
            part.segment = LatentTrajectory(
                latents=lat[b].clone(),
                positions=keep,
                sigmas=list(params.sigmas),
                sde_indices=sde_indices,
                log_probs=None if lp is None else lp[b].clone(),
                old_means=None if om is None else om[b].clone(),
            )
            out: ImagePrimitive | VideoPrimitive = (
                VideoPrimitive(frames=media[b], fps=_video_bundle(params, self.bundle).fps)
                if video
                else ImagePrimitive(pixels=media[b])
            )
            part.outputs = [out]
            part.status = "completed"

    def _denoise(
        self,
        x: Tensor,
        sigmas: Tensor,
        params: DiffusionSamplingParams,
        strategy: SDEStrategy,
        sde_set: set[int],
        keep: list[int],
        pos: dict[str, Tensor],
        neg: dict[str, Tensor] | None,
        step_gens: list[torch.Generator] | list[FrameNoise],
    ) -> tuple[Tensor, dict[int, Tensor], list[Tensor], list[Tensor]]:
        """The T steps: SDE on ``sde_set``, Euler elsewhere. Returns (x_final, stored latents by
        position, per-SDE-step log-probs [B] each, per-SDE-step means [B, ...] when recorded)."""
        stored: dict[int, Tensor] = {}
        log_probs: list[Tensor] = []
        means: list[Tensor] = []
        shape = tuple(x.shape[1:])
        for j in range(params.num_steps):
            if j in keep:
                stored[j] = x.cpu()
            with torch.enable_grad() if self.rollout_autograd else contextlib.nullcontext():
                v = self._forward(x, sigmas[:, j], pos, neg, params.guidance_scale).detach()
            if j in sde_set:
                z = torch.stack(
                    [
                        g.draw()
                        if isinstance(g, FrameNoise)
                        else torch.randn(shape, generator=g, dtype=torch.float32)
                        for g in step_gens
                    ]
                )
                res: StepResult = strategy.step(x, v, sigmas, j, params.eta, noise=z.to(x.device))
                if res.log_prob is not None:
                    log_probs.append(res.log_prob.cpu())
                if self.record_old_means:
                    means.append(res.mean.cpu())
            else:
                res = ode_step(x, v, sigmas[:, j], sigmas[:, j + 1])
            x = res.x_next
        stored[params.num_steps] = x.cpu()
        return x, stored, log_probs, means

    def encode_conditions(
        self, samples: Sequence[Sample], params: DiffusionSamplingParams
    ) -> list[Conditions]:
        """The conditions replay needs for each Sample (its prompt, and the negative prompt under
        CFG), as ``generate`` stores them: for Parts an HTTP engine filled, which returns none."""
        return self._encode([(s, s.part(self.stage), params) for s in samples], params)

    def _encode(
        self, members: list[tuple[Sample, Part, DiffusionSamplingParams]], params: DiffusionSamplingParams
    ) -> list[Conditions]:
        """Per-sample conditions; each distinct prompt is encoded once, the negative prompt once per pipeline."""
        texts = [s.part(self.prompt_part).text if self.prompt_part else s.prompt for s, _, _ in members]
        unique = list(dict.fromkeys(texts))
        encoded = dict(zip(unique, self.bundle.encode_prompts(unique)))
        neg: Conditions | None = None
        if params.cfg and not getattr(self.bundle, "embedded_guidance", False):
            if params.negative_prompt not in self._negative_cache:
                self._negative_cache[params.negative_prompt] = self.bundle.encode_prompts(
                    [params.negative_prompt]
                )[0]
            neg = self._negative_cache[params.negative_prompt]
        out = []
        for t in texts:
            tensors = dict(encoded[t].tensors)
            if neg is not None:
                tensors.update({NEGATIVE_PREFIX + k: v for k, v in neg.tensors.items()})
            out.append(Conditions(tensors=tensors))
        return out

    # ---- model call ---------------------------------------------------------------------------
    def _stack(
        self, conditions: Sequence[Conditions], guidance: float
    ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
        """Batched (positive, negative-or-None) conditions on the bundle's device and dtype."""
        b = self.bundle
        keys = [k for k in conditions[0].tensors if not k.startswith(NEGATIVE_PREFIX)]
        pos = stack_conditions(conditions, keys, b.device, b.dtype)
        if getattr(b, "embedded_guidance", False):
            pos["guidance"] = torch.full(
                (len(conditions),), float(guidance), device=b.device, dtype=torch.float32
            )
            return pos, None
        if guidance <= 1.0:
            return pos, None
        neg = stack_conditions(conditions, keys, b.device, b.dtype, prefix=NEGATIVE_PREFIX)
        for k in keys:  # one CFG batch: per-prompt lengths of cond and uncond padded to one
            if pos[k].ndim > 1 and pos[k].shape[1] != neg[k].shape[1]:
                n = max(pos[k].shape[1], neg[k].shape[1])
                pos[k], neg[k] = (torch.stack(pad_to_length(list(t), n, k)) for t in (pos[k], neg[k]))
        return pos, neg

    def _forward(
        self, x: Tensor, sigma: Tensor, pos: dict[str, Tensor], neg: dict[str, Tensor] | None, guidance: float
    ) -> Tensor:
        """Velocity with CFG ``v_u + w (v_c - v_u)`` (or the bundle's ``combine_cfg``) when ``neg`` is
        given, cond and uncond in ONE forward.

        A bundle with ``embedded_guidance`` (FLUX.1-dev) instead gets ``conditions["guidance"]`` = w [B].
        """
        x_in = x.to(self.bundle.dtype)
        if neg is None:
            return self.bundle.predict_velocity(x_in, sigma, pos)
        both = {k: torch.cat([neg[k], pos[k]]) for k in pos}
        out = self.bundle.predict_velocity(torch.cat([x_in, x_in]), torch.cat([sigma, sigma]), both)
        v_u, v_c = out.chunk(2)
        combine = getattr(self.bundle, "combine_cfg", classic_cfg)  # the family's own CFG, if it has one
        return combine(v_u, v_c, guidance)

    def _guided_velocity(
        self, x: Tensor, sigma: Tensor, conditions: Sequence[Conditions], guidance: float
    ) -> Tensor:
        pos, neg = self._stack(conditions, guidance)
        return self._forward(x, sigma, pos, neg, guidance)

    def velocity(
        self, latents: Tensor, sigma: Tensor, conditions: Sequence[Conditions], guidance: float
    ) -> Tensor:
        """Guided velocity (fp32, with gradients) for ``latents`` [B, ...] at ``sigma`` [B] (NFT / SFT)."""
        if len(conditions) != latents.shape[0]:
            raise ValueError(f"got {len(conditions)} conditions for a batch of {latents.shape[0]} latents")
        sig = torch.as_tensor(sigma, device=self.bundle.device).to(torch.float32).reshape(-1)
        if sig.numel() == 1:
            sig = sig.expand(latents.shape[0])
        x = latents.to(self.bundle.device, torch.float32)
        return self._guided_velocity(x, sig, conditions, guidance).to(torch.float32)

    # ---- replay -------------------------------------------------------------------------------
    def replay_step(self, parts: Sequence[Part], step: int) -> StepReplay:
        """Re-score the stored transition x_step -> x_{step+1} of each Part, with gradients."""
        if not parts:
            raise ValueError("replay_step needs at least one part")
        params = [self._check_part(p, step) for p in parts]
        p0 = params[0]
        for p, pp in zip(parts, params):
            for field in ("sde_strategy", "eta", "guidance_scale", "negative_prompt"):
                if getattr(pp, field) != getattr(p0, field):
                    raise ValueError(
                        f"parts in one replay micro-batch must share sampling_params.{field}: "
                        f"{getattr(pp, field)!r} (part {p.name!r}) vs {getattr(p0, field)!r}"
                    )
        segs = [p.segment for p in parts]
        dev = self.bundle.device
        x = torch.stack([to_torch(s.latent_at(step)) for s in segs]).to(dev, torch.float32)  # type: ignore[union-attr]
        x_next = torch.stack([to_torch(s.latent_at(step + 1)) for s in segs]).to(dev, torch.float32)  # type: ignore[union-attr]
        sigmas = torch.tensor([s.sigmas for s in segs], dtype=torch.float32, device=dev)  # type: ignore[union-attr]
        conds = [p.conditions for p in parts]
        v = self._guided_velocity(x, sigmas[:, step], conds, p0.guidance_scale)  # type: ignore[arg-type]
        res = get_strategy(p0.sde_strategy).step(x, v, sigmas, step, p0.eta, x_next=x_next)
        return StepReplay(log_prob=res.log_prob, mean=res.mean, std=res.std, velocity=v.to(torch.float32))

    def _check_part(self, part: Part, step: int) -> DiffusionSamplingParams:
        seg, params = part.segment, part.sampling_params
        if not isinstance(seg, LatentTrajectory) or not isinstance(params, DiffusionSamplingParams):
            raise TypeError(
                f"part {part.name!r} needs a LatentTrajectory segment and DiffusionSamplingParams to replay; "
                f"got {type(seg).__name__} / {type(params).__name__}"
            )
        if part.conditions is None:
            raise ValueError(
                f"part {part.name!r} has no conditions; it was not produced by a FlowMatchPipeline"
            )
        if step not in seg.sde_indices:
            raise ValueError(
                f"step={step} is not an SDE step of part {part.name!r} (sde_indices={seg.sde_indices}, "
                f"num_steps={seg.num_steps}); only SDE steps have a log-prob to replay"
            )
        if params.sigmas is not None and list(params.sigmas) != list(seg.sigmas):
            raise ValueError(
                f"part {part.name!r}: segment sigmas differ from the pinned sampling_params.sigmas"
            )
        return params
