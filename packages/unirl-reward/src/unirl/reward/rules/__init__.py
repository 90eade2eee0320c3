"""Rule-based scorers: no torch, no weights."""
