"""Checkpoints: atomic reading and writing (io), averaging (§6.1), resuming a killed run, and
loading a trained model for inference."""
