"""Model bundles: the trainable and frozen modules of a model family, behind one protocol.

Family modules (``sd3``, ``flux``) import diffusers / transformers; import them directly.
"""

from unirl.rollout.models.base import NEGATIVE_PREFIX, FlowBundle, stack_conditions, to_uint8_images

__all__ = ["NEGATIVE_PREFIX", "FlowBundle", "stack_conditions", "to_uint8_images"]
