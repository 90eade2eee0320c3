"""Single-controller runtime on Ray: Remote workers, placement, tensor transport (data plane) and weight sync (weight plane)."""

__version__ = "0.1.0"
