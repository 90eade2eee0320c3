"""Tiny from-scratch models for offline worlds: word tokenizer + text encoder, pixel U-Net, and the
pixel-space `PixelFlowBundle` (import submodules directly; they import torch / diffusers)."""
