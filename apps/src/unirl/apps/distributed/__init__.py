"""The Ray layout of the domain trainers: a single controller over train and rollout workers.

``layout.kind: ray`` in a recipe runs the same lifecycle with data-parallel FSDP2 train workers
and trainside rollout workers fed through the weight plane; ``single`` (the default) is the
one-process run.
"""

from unirl.apps.distributed.layout import LayoutConfig, check_layout

__all__ = ["LayoutConfig", "check_layout"]
