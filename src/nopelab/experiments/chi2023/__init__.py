"""Chi et al. 2023, the shrinking variance: the random-init model (``random_init``), byte-level
LMs trained on text (``pretrained``) and probes of the random model (``probe_study``)."""
