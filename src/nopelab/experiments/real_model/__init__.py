"""A real pretrained model, SmolLM2-135M: RoPE switched off in some layers without retraining
(``smollm2``)."""
