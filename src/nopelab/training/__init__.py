"""Training: synthetic tasks, text corpora, tokenizers, the loop and its checkpoints."""
