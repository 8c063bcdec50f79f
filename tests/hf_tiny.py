"""Tiny random Hugging Face causal LMs, built locally from their config classes (no hub)."""

from __future__ import annotations

import torch

VOCAB, D, LAYERS, HEADS = 64, 32, 4, 4
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=D,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
)
# Per architecture: the layers (1-based) that apply RoPE, as built below.
ROPE_LAYERS = {
    "gpt2": [],
    "llama": [1, 2, 3, 4],
    "mistral": [1, 2, 3, 4],
    "qwen2": [1, 2, 3, 4],
    "smollm3": [1, 3],
    "llama4_text": [1, 2, 4],
    "cohere2": [1, 2, 3],
}
ARCHITECTURES = list(ROPE_LAYERS)


def tiny(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A randomly initialised tiny model of ``model_type`` in eval mode."""
    import transformers as tf

    torch.manual_seed(seed)
    if model_type == "gpt2":
        config = tf.GPT2Config(
            vocab_size=VOCAB, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_positions=128,
            bos_token_id=0, eos_token_id=1, **overrides,
        )  # fmt: skip
        return tf.GPT2LMHeadModel(config).eval()
    if model_type == "smollm3":
        config = tf.SmolLM3Config(**{**COMMON, "no_rope_layers": [1, 0, 1, 0], **overrides})
        return tf.SmolLM3ForCausalLM(config).eval()
    if model_type == "llama4_text":
        config = tf.Llama4TextConfig(
            **{**COMMON, "intermediate_size_mlp": 64, "no_rope_layers": [1, 1, 0, 1]},
            interleave_moe_layer_step=2, num_local_experts=2, **overrides,
        )  # fmt: skip
        return tf.Llama4ForCausalLM(config).eval()
    if model_type == "cohere2":
        layer_types = ["sliding_attention"] * 3 + ["full_attention"]
        config = tf.Cohere2Config(**COMMON, sliding_window=8, layer_types=layer_types, **overrides)
        return tf.Cohere2ForCausalLM(config).eval()
    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),  # for its free head_dim only
    }
    config_class, model_class = classes[model_type]
    return model_class(config_class(**{**COMMON, **overrides})).eval()
