"""The vLLM worker extension that loads trainer weights into a running vLLM engine.

vLLM mixes this class into each of its workers (``worker_extension_cls``), so its methods run
inside the engine process, next to the model, and are called through ``collective_rpc``: with
the named tensors themselves (offline ``vllm.LLM``, where vLLM's msgpack carries tensors), or
with the path of a safetensors file on the same host (server mode, whose HTTP ``/collective_rpc``
passes strings only).

What one call checks, in order, before it reports success:
1. the caller's token (server mode: vLLM's dev endpoints are not covered by its API key, so the
   token given at launch guards these methods);
2. the checksum of the received bytes equals the trainer's (nothing is loaded otherwise);
3. the model's ``load_weights`` consumed the tensors, and — with ``strict`` — every parameter of
   the vLLM model was written (a sync that misses e.g. the fused ``qkv_proj`` fails);
4. the engine's own parameters changed when the received bytes changed (a silent no-op sync,
   e.g. a loader that skipped every name, fails here).
It imports vLLM only inside the worker (where vLLM is loaded anyway).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable
from typing import Any

import torch

from unirl.distributed.codec import Checksum

TOKEN_ENV = "UNIRL_VLLM_RPC_TOKEN"

__all__ = ["TOKEN_ENV", "UnirlWorkerExtension", "fingerprint"]


def fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """XXH3-128 (`Checksum`) over the engine's own parameters (vLLM layout: fused qkv, gate_up, ...)."""
    c = Checksum()
    for name, t in named:
        c.update(name, t.detach())
    return c.hexdigest()


class UnirlWorkerExtension:
    """Mixed into vLLM's worker: ``self.model_runner`` is the worker's model runner."""

    model_runner: Any

    def _unirl_model(self) -> torch.nn.Module:
        get = getattr(self.model_runner, "get_model", None)
        model: torch.nn.Module = get() if callable(get) else self.model_runner.model
        return model

    def _unirl_check_token(self, token: str | None) -> None:
        want = os.environ.get(TOKEN_ENV)
        if want is not None and not hmac.compare_digest(str(token or ""), want):
            raise PermissionError("unirl weight load rejected: wrong or missing rpc token")

    def _unirl_reload(self, model: torch.nn.Module, items: list[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint-format tensors in place; returns the engine parameter names written.

        A plain ``model.load_weights`` is not enough after start-up: vLLM post-processes weights
        into kernel layouts (e.g. CPU GEMM repacking) and drops their loaders. Its layerwise
        reload restores the checkpoint layout on meta tensors, loads, re-runs the processing and
        copies the result into the original storage (what ``model_runner.reload_weights`` does,
        spelled out here because that one does not report which parameters were written).
        """
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(model)
        try:
            loaded = model.load_weights(iter(items))  # type: ignore[operator]
        finally:
            finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)
        _reprocess_tied_lm_head(model)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(self.model_runner, reset, None)
            if callable(fn):
                fn()
        return set(loaded or ())

    def unirl_fingerprint(self, token: str | None = None) -> str:
        """Checksum of the engine's parameters as they are now."""
        self._unirl_check_token(token)
        return fingerprint(self._unirl_model().named_parameters())

    def unirl_load_weights(
        self,
        named: list[tuple[str, torch.Tensor]] | list[list[Any]] | str,
        expected_checksum: str,
        strict: bool = True,
        token: str | None = None,
    ) -> dict[str, Any]:
        """Verify and load trainer tensors (HF names); returns what was received and loaded.

        ``named``: ``[(name, tensor), ...]`` or a safetensors file path (read, then deleted by
        the caller). Raises ValueError on a checksum mismatch, a partial or a no-op load.
        """
        self._unirl_check_token(token)
        if isinstance(named, str):
            from safetensors.torch import load_file

            tensors = load_file(named, device="cpu")
            order = _read_order(named)
            items = [(n, tensors[n]) for n in order]
        else:
            items = [(str(n), t) for n, t in named]  # msgpack may hand back lists, not tuples
        if not items:
            raise ValueError("unirl weight load: zero tensors received; the trainer sent nothing")
        c = Checksum()
        nbytes = 0
        for n, t in items:
            c.update(n, t)
            nbytes += t.numel() * t.element_size()
        got = c.hexdigest()
        if got != expected_checksum:
            raise ValueError(
                f"unirl weight load: received bytes hash to {got}, the trainer's checksum is "
                f"{expected_checksum}; the weights were corrupted in transit and were NOT loaded"
            )
        model = self._unirl_model()
        before = fingerprint(model.named_parameters())
        loaded = self._unirl_reload(model, items)
        if not loaded:
            raise ValueError(
                f"unirl weight load: the model's load_weights consumed none of the {len(items)} tensors "
                f"(first names: {[n for n, _ in items[:3]]}); are these the model's HF parameter names?"
            )
        params = {n for n, _ in model.named_parameters()}
        missing = sorted(params - loaded)
        if strict and missing:
            raise ValueError(
                f"unirl weight load: {len(missing)} engine parameters were not written by this sync "
                f"(e.g. {missing[:4]}); send every parameter or pass strict=False for a partial sync"
            )
        after = fingerprint(model.named_parameters())
        return {
            "checksum": got,
            "num_tensors": len(items),
            "num_bytes": nbytes,
            "num_loaded": len(loaded),
            "fingerprint_before": before,
            "fingerprint_after": after,
        }


def _reprocess_tied_lm_head(model: torch.nn.Module) -> None:
    """Re-derive a tied LM head's kernel state from the freshly loaded embedding.

    With ``tie_word_embeddings`` the checkpoint has no ``lm_head.weight``, so the layerwise
    reload never touches the head; but on CPU its weight was packed into a separate GEMM buffer
    at start-up, which would keep the *old* embedding (measured: canary log-probs off by >1
    nat after a sync that changed the embedding). The head shares the embedding's Parameter, so
    running its ``process_weights_after_loading`` again repacks the new values.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", None):
        return
    method = getattr(head, "quant_method", None)
    process = getattr(method, "process_weights_after_loading", None)
    if callable(process):
        process(head)


def _read_order(path: str) -> list[str]:
    """Tensor names in the order the trainer wrote them (stored in the file's metadata)."""
    import json

    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        keys = list(f.keys())
    order = json.loads(meta.get("unirl_order", "null")) or keys
    if sorted(order) != sorted(keys):
        raise ValueError(f"unirl weight load: {path} lists {len(order)} names but holds {len(keys)} tensors")
    return [str(n) for n in order]
