"""Parity with Hugging Face: a native model and a ``transformers`` model holding its weights
compute the same function.

Each Hugging Face model is built locally from a configuration written out here (no hub), so
the test also pins down which settings make the two architectures agree; weights are copied by
:func:`nopelab.hf.export.hf_tensors`. Norm gains and biases are perturbed first, so a gain or
bias copied to the wrong place shows. Logits and every layer's output must agree within
ATOL at float32 (measured: identical to the last bit on the CPU).
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from torch import Tensor

from nopelab.config import ModelConfig
from nopelab.hf.export import hf_tensors
from nopelab.models.transformer import Transformer

ATOL = 1e-5
VOCAB, D, LAYERS, HEADS, T = 48, 32, 2, 4, 16
NO_SPECIAL_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def native(**overrides: object) -> Transformer:
    """A tiny native model (init_std 0.2: far from uniform attention) with perturbed 1-d weights."""
    values = dict(
        vocab_size=VOCAB, d_model=D, n_layers=LAYERS, n_heads=HEADS, max_seq_len=T, init_std=0.2
    )
    values.update(overrides)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**values)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # norm gains and biases: ones and zeros after init
                param.add_(0.1 * torch.randn_like(param))
    return model


def gpt2(cfg: ModelConfig) -> tf.GPT2LMHeadModel:
    config = tf.GPT2Config(
        vocab_size=VOCAB, n_positions=T, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_inner=4 * D,
        activation_function="gelu", layer_norm_epsilon=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, **NO_SPECIAL_TOKENS,
    )  # fmt: skip
    return tf.GPT2LMHeadModel(config)


LLAMA = dict(
    vocab_size=VOCAB, hidden_size=D, intermediate_size=4 * D, num_hidden_layers=LAYERS,
    num_attention_heads=HEADS, num_key_value_heads=HEADS, hidden_act="silu",
    max_position_embeddings=T, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **NO_SPECIAL_TOKENS,
)  # fmt: skip


def llama(cfg: ModelConfig) -> tf.LlamaForCausalLM:
    return tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA, tie_word_embeddings=cfg.tie_embeddings))


def smollm3(cfg: ModelConfig, no_rope_layers: list[int]) -> tf.SmolLM3ForCausalLM:
    config = tf.SmolLM3Config(
        **LLAMA, no_rope_layers=no_rope_layers, use_sliding_window=False,
        tie_word_embeddings=cfg.tie_embeddings,
    )  # fmt: skip
    return tf.SmolLM3ForCausalLM(config)


def with_native_weights(hf: tf.PreTrainedModel, model: Transformer) -> tf.PreTrainedModel:
    hf.load_state_dict(hf_tensors(model), strict=True)
    return hf.eval()


def tokens() -> Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def native_states(model: Transformer, idx: Tensor) -> tuple[Tensor, list[Tensor], Tensor]:
    """Logits; the embedding output then each block's output; the final norm's output."""
    states: list[Tensor] = []
    sites = [model.hook_embed, *(b.hook_resid_post for b in model.blocks), model.norm_f]
    handles = [s.register_forward_hook(lambda _m, _i, out: states.append(out)) for s in sites]
    try:
        logits = model(idx)
    finally:
        for h in handles:
            h.remove()
    return logits, states[:-1], states[-1]


@torch.no_grad()
def hf_states(hf: tf.PreTrainedModel, idx: Tensor) -> tuple[Tensor, list[Tensor], Tensor]:
    """The same three from ``hf``. Its ``hidden_states`` hold the embedding output and each
    layer's output, except the last entry, which is after the final norm; the last layer's own
    output is read with a hook."""
    layers = hf.transformer.h if isinstance(hf, tf.GPT2LMHeadModel) else hf.model.layers
    last: list[Tensor] = []
    handle = layers[-1].register_forward_hook(
        lambda _m, _i, out: last.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        out = hf(input_ids=idx, output_hidden_states=True)
    finally:
        handle.remove()
    assert len(out.hidden_states) == LAYERS + 1
    return out.logits, [*out.hidden_states[:-1], last[0]], out.hidden_states[-1]


def assert_same_function(model: Transformer, hf: tf.PreTrainedModel) -> None:
    idx = tokens()
    logits, states, final = native_states(model, idx)
    hf_logits, hf_layer_states, hf_final = hf_states(hf, idx)
    for i, (a, b) in enumerate(zip(hf_layer_states, states, strict=True)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"layer {i} output")
    torch.testing.assert_close(hf_final, final, atol=ATOL, rtol=0, msg="final norm")
    torch.testing.assert_close(hf_logits, logits, atol=ATOL, rtol=0, msg="logits")
    assert logits.std() > 1  # not a degenerate comparison


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tie", [True, False])
def test_learned_pe_equals_gpt2(bias: bool, tie: bool) -> None:
    model = native(pos_encoding="learned", bias=bias, tie_embeddings=tie)
    assert_same_function(model, with_native_weights(gpt2(model.cfg), model))


def test_nope_layernorm_equals_gpt2_with_zero_positions() -> None:
    model = native(pos_encoding="none", bias=True)
    hf = with_native_weights(gpt2(model.cfg), model)
    assert not hf.transformer.wpe.weight.any()
    assert_same_function(model, hf)


def test_rope_equals_llama() -> None:
    model = native(pos_encoding="rope", norm="rmsnorm", mlp="swiglu")
    assert_same_function(model, with_native_weights(llama(model.cfg), model))


def test_rope_untied_equals_llama() -> None:
    model = native(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", tie_embeddings=False)
    assert_same_function(model, with_native_weights(llama(model.cfg), model))


def test_nope_equals_smollm3_without_rope_layers() -> None:
    model = native(pos_encoding="none", norm="rmsnorm", mlp="swiglu")
    assert_same_function(model, with_native_weights(smollm3(model.cfg, [0, 0]), model))


def test_rope_with_nope_layer_equals_smollm3() -> None:
    model = native(pos_encoding="rope", nope_layers=(2,), norm="rmsnorm", mlp="swiglu")
    # SmolLM3's no_rope_layers marks the layers that DO apply RoPE with 1, despite its name
    assert_same_function(model, with_native_weights(smollm3(model.cfg, [1, 0]), model))


def test_smollm3_polarity_matters() -> None:
    model = native(pos_encoding="rope", nope_layers=(2,), norm="rmsnorm", mlp="swiglu")
    inverted = with_native_weights(smollm3(model.cfg, [0, 1]), model)
    with pytest.raises(AssertionError):
        assert_same_function(model, inverted)
    idx = tokens()
    with torch.no_grad():
        assert (inverted(input_ids=idx).logits - model(idx)).abs().max() > 0.1


def test_rope_equals_mistral_and_qwen2() -> None:
    """Mistral (no sliding window) and Qwen2 (its q/k/v biases zero) are Llama here too."""
    model = native(pos_encoding="rope", norm="rmsnorm", mlp="swiglu")
    mistral = tf.MistralForCausalLM(
        tf.MistralConfig(**LLAMA, sliding_window=None, head_dim=D // HEADS)
    )
    assert_same_function(model, with_native_weights(mistral, model))
    qwen2 = tf.Qwen2ForCausalLM(tf.Qwen2Config(**LLAMA, use_sliding_window=False))
    tensors = hf_tensors(model)
    for i in range(LAYERS):
        for name in "qkv":
            tensors[f"model.layers.{i}.self_attn.{name}_proj.bias"] = torch.zeros(D)
    qwen2.load_state_dict(tensors, strict=True)
    assert_same_function(model, qwen2.eval())
