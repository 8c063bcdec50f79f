"""A decoder-only transformer with switchable positional encodings."""
