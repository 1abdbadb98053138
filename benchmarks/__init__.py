"""Side-by-side benchmarks of the idempotency app; run ``python benchmarks/run.py``."""
