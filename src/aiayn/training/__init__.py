"""Training: the LightningModule, the learning-rate schedule, the callbacks, preemption and the
check of a whole training config."""
