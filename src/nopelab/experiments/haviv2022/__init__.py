"""Haviv et al. 2022, position in NoPE language models: position probes per layer
(``pretrained``) and the perplexity gap to NoPE across model sizes (``sizes``)."""
