"""Domain trainers: one short controller per domain."""
