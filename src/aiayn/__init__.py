"""aiayn: the Transformer of "Attention Is All You Need"."""
