"""Weight updates of an SGLang server over its HTTP API, one class per route.

- :class:`DistributedRoute`: ``/init_weights_update_group`` once, then per bucket
  ``/update_weights_from_distributed`` (names, dtypes, shapes) while this process, rank 0 of the
  weight-update group, broadcasts each tensor in that order. The HTTP call returns only after the
  server received the bucket, so it runs concurrently with the broadcast.
- :class:`DiskRoute`: safetensors shards in a directory the server can read, then
  ``/update_weights_from_disk``. This is the pickle-free way to ship tensors to SGLang: its
  ``/update_weights_from_tensor`` route unpickles its payload (``MultiprocessingSerializer``),
  which this project never sends.
- :class:`LoraRoute`: the adapter tensors as a PEFT adapter directory, loaded with
  ``/load_lora_adapter`` under a fresh name per version (the previous one is unloaded), so a
  request never mixes two versions of an adapter.

Each route stamps exactly the tensors it shipped (``guards.weight_stamp`` semantics) and returns
the stamp; the engine compares it with the trainer's and verifies the server.
"""

from unirl.rollout.engines.sglang_sync.disk import DiskRoute
from unirl.rollout.engines.sglang_sync.distributed import DistributedRoute, new_weight_update_group
from unirl.rollout.engines.sglang_sync.lora import LoraRoute, peft_key

__all__ = ["DiskRoute", "DistributedRoute", "LoraRoute", "new_weight_update_group", "peft_key"]
