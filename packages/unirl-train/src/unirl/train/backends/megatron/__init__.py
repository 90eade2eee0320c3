"""The megatron-core backend (extra `megatron`): a Hugging Face causal LM trained as a megatron-core
GPTModel, converted both ways by mbridge. Importing this package does not import megatron-core."""

from unirl.train.backends.megatron.config import MegatronConfig

__all__ = ["MegatronConfig"]
