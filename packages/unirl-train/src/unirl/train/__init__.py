"""TrainStack, FSDP2 and megatron-core backends, and the RL/SFT stage algorithms of unirl."""

__version__ = "0.1.0"
