"""The 10% treebank sample as the parsing tests split it, and a network small enough to decode
with in a test."""

SAMPLE_SPLIT = {"train_split": "wsj_0001-wsj_0159", "val_split": "wsj_0160-wsj_0179", "test_split": "wsj_0180-wsj_0199"}
SMALL = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.0, "max_positions": 512}
