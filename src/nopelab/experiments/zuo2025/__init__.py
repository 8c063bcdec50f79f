"""Zuo et al. 2025, nearby similarity: adjacency at random init (``random_init``), the models
trained on Zuo's tasks (``trained``), their steps to mastery over seeds (``mastery``) and the
position probes of similarity, variance and norm (``probes``)."""
