"""Pure loss math for the stage algorithms: small functions on tensors, no model, no Sample.

One file per algorithm. Every convention is pinned by a worked-number test in
``packages/unirl-train/tests/test_loss_*.py``; see ``/work/shared/REFERENCE_MATH.md``.
"""
