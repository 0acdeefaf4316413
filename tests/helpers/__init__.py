"""What the tests share and are not tests: running the tools and the tiny run's settings (runs.py),
reading W&B offline run files (wandb_offline.py), random padded batches and closeness measures for
comparing a fast path with the plain one (batches.py)."""
