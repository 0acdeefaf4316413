"""Training: the LightningModule, the loss, the learning-rate schedule and their helpers."""
