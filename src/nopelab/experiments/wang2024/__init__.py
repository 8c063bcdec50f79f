"""Wang et al. 2024, past the training length: perplexity and its mechanisms by length, and the
attention-logit scale fixes (``lengths``)."""
