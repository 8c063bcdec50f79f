"""Hugging Face models: loading, capture sites, positional-encoding detection, export."""
