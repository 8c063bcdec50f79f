"""Export a native :class:`~nopelab.models.transformer.Transformer` as an equivalent Hugging Face model.

The native configuration picks the architecture whose forward pass computes the same function:

* ``gpt2`` (``GPT2LMHeadModel``): pos_encoding learned or none, layernorm, gelu MLP. GPT-2 has
  biases everywhere, so a native model without biases gets zero biases; a NoPE model gets an
  all-zero position table ``wpe``, which must stay zero (frozen) if the export is fine-tuned:
  ``model.transformer.wpe.weight.requires_grad_(False)``.
* ``llama`` (``LlamaForCausalLM``): rope in every layer, rmsnorm, swiglu MLP, no biases.
* ``smollm3`` (``SmolLM3ForCausalLM``): as llama, with pos_encoding none or rope with
  nope_layers; SmolLM3's ``no_rope_layers`` holds 1 for a layer that applies RoPE, 0 for NoPE.

Every export is pre-LN and causal. Anything else is a :class:`~nopelab.errors.ConfigError`.
Hugging Face attention scales the logits by 1/sqrt(head_dim) alone: a ``logit_scale`` or
``head_scales`` is folded into the query projection's rows (q·k is linear in q, RoPE rotates q
linearly), so the exported model computes the same function without knowing of it.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from torch import Tensor, nn
from transformers.utils import logging as hf_logging

from nopelab.config import ModelConfig
from nopelab.encodings import encoding
from nopelab.errors import ConfigError
from nopelab.models.transformer import (
    MLP,
    Attention,
    Block,
    LearnedPositionalEmbedding,
    SwiGLU,
    Transformer,
)

EXPORTABLE = (
    "gpt2 (pos_encoding learned or none, norm layernorm, mlp gelu)",
    "llama (pos_encoding rope, norm rmsnorm, mlp swiglu, no bias)",
    "smollm3 (pos_encoding none or rope with nope_layers, norm rmsnorm, mlp swiglu, no bias)",
)
TOLERANCE = 1e-4  # the parity check: max |Δlogit| relative to max(1, max |logit|)


def _refuse(field: str, message: str) -> ConfigError:
    allowed = "; ".join(EXPORTABLE)
    return ConfigError(field, f"{message}; exportable, all pre-LN and causal: {allowed}")


def family(cfg: ModelConfig) -> str:
    """``gpt2``, ``llama`` or ``smollm3``: the architecture that computes what ``cfg`` does."""
    if cfg.bidirectional:
        raise _refuse("bidirectional", "Hugging Face causal LMs mask the future")
    if cfg.norm_position != "pre":
        raise _refuse("norm_position", f"{cfg.norm_position}-LN does not export")
    families = encoding(cfg.pos_encoding).export
    if not families:
        raise _refuse("pos_encoding", f"{cfg.pos_encoding} does not export")
    gpt2 = families == ("gpt2",) or ("gpt2" in families and cfg.norm == "layernorm")
    if gpt2:
        if cfg.norm != "layernorm":
            raise _refuse("norm", f"pos_encoding {cfg.pos_encoding} needs layernorm (gpt2)")
        if cfg.mlp != "gelu":
            raise _refuse("mlp", f"{cfg.pos_encoding} with layernorm needs mlp gelu (gpt2)")
        return "gpt2"
    if cfg.norm != "rmsnorm":
        raise _refuse("norm", f"pos_encoding {cfg.pos_encoding} needs rmsnorm (llama, smollm3)")
    if cfg.mlp != "swiglu":
        raise _refuse("mlp", "rmsnorm needs mlp swiglu (llama, smollm3)")
    if cfg.bias:
        raise _refuse("bias", "llama and smollm3 exports have no biases")
    return "llama" if "llama" in families and not cfg.nope_layers else "smollm3"


def hf_config(cfg: ModelConfig) -> transformers.PreTrainedConfig:
    """The Hugging Face configuration of the architecture :func:`family` picks."""
    name = family(cfg)
    common: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if name == "gpt2":
        return transformers.GPT2Config(
            n_positions=cfg.max_seq_len,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_inner=cfg.mlp_ratio * cfg.d_model,
            activation_function="gelu",  # exact erf GELU, as F.gelu; GPT-2's own is gelu_new
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
            layer_norm_epsilon=cfg.norm_eps,
            **common,
        )
    llama: dict[str, Any] = dict(
        hidden_size=cfg.d_model,
        intermediate_size=cfg.mlp_ratio * cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False,
        attention_dropout=cfg.dropout,
        mlp_bias=False,
        **common,
    )
    if name == "llama":
        return transformers.LlamaConfig(head_dim=cfg.head_dim, **llama)
    return transformers.SmolLM3Config(
        no_rope_layers=[int(uses) for uses in cfg.attention_pe_layers()],  # 1 = RoPE, 0 = NoPE
        use_sliding_window=False,
        sliding_window=None,
        layer_types=["full_attention"] * cfg.n_layers,
        **llama,
    )


def _qkv(attn: Attention) -> tuple[Tensor, Tensor | None]:
    """The fused q, k, v projection's weight and bias, each head's logit factor folded into its
    query rows."""
    weight, bias = attn.qkv.weight, attn.qkv.bias
    queries = attn.logit_scales().detach().to(weight).repeat_interleave(attn.head_dim)
    factor = torch.cat([queries, torch.ones(2 * queries.numel()).to(weight)])
    return weight * factor[:, None], None if bias is None else bias * factor


def _gpt2_tensors(model: Transformer) -> dict[str, Tensor]:
    """Native weights under GPT-2's names; Conv1D stores (in, out), so matrices are transposed."""
    cfg = model.cfg

    def norm(prefix: str, module: nn.Module) -> dict[str, Tensor]:
        layer_norm = cast(nn.LayerNorm, module)  # family() checked: layernorm (gpt2)
        bias = layer_norm.bias if layer_norm.bias is not None else torch.zeros(cfg.d_model)
        return {f"{prefix}.weight": layer_norm.weight, f"{prefix}.bias": bias}

    def conv(prefix: str, weight: Tensor, bias: Tensor | None) -> dict[str, Tensor]:
        bias = bias if bias is not None else torch.zeros(weight.shape[0])
        return {f"{prefix}.weight": weight.T, f"{prefix}.bias": bias}

    if encoding(cfg.pos_encoding).table:
        positions = cast(LearnedPositionalEmbedding, model.pos).table.weight
    else:  # NoPE: a position table that adds nothing
        positions = torch.zeros(cfg.max_seq_len, cfg.d_model)
    tensors = {
        "transformer.wte.weight": model.embed.weight,
        "transformer.wpe.weight": positions,
        **norm("transformer.ln_f", model.norm_f),
        "lm_head.weight": model.lm_head.weight,
    }
    for i, block in enumerate(cast(Iterable[Block], model.blocks)):
        prefix = f"transformer.h.{i}"
        mlp = cast(MLP, block.mlp)  # family() checked: gelu MLP (gpt2)
        tensors |= {
            **norm(f"{prefix}.ln_1", block.norm_1),
            **conv(f"{prefix}.attn.c_attn", *_qkv(block.attn)),  # q, k, v stacked alike
            **conv(f"{prefix}.attn.c_proj", block.attn.proj.weight, block.attn.proj.bias),
            **norm(f"{prefix}.ln_2", block.norm_2),
            **conv(f"{prefix}.mlp.c_fc", mlp.fc.weight, mlp.fc.bias),
            **conv(f"{prefix}.mlp.c_proj", mlp.proj.weight, mlp.proj.bias),
        }
    return tensors


def _llama_tensors(model: Transformer) -> dict[str, Tensor]:
    """Native weights under Llama's (and SmolLM3's) names; the fused qkv is split."""

    def norm(module: nn.Module) -> Tensor:
        return cast(nn.RMSNorm, module).weight  # family() checked: rmsnorm (llama, smollm3)

    tensors = {
        "model.embed_tokens.weight": model.embed.weight,
        "model.norm.weight": norm(model.norm_f),
        "lm_head.weight": model.lm_head.weight,
    }
    for i, block in enumerate(cast(Iterable[Block], model.blocks)):
        prefix = f"model.layers.{i}"
        mlp = cast(SwiGLU, block.mlp)  # family() checked: swiglu (llama, smollm3)
        q, k, v = _qkv(block.attn)[0].chunk(3, dim=0)
        tensors |= {
            f"{prefix}.input_layernorm.weight": norm(block.norm_1),
            f"{prefix}.self_attn.q_proj.weight": q,
            f"{prefix}.self_attn.k_proj.weight": k,
            f"{prefix}.self_attn.v_proj.weight": v,
            f"{prefix}.self_attn.o_proj.weight": block.attn.proj.weight,
            f"{prefix}.post_attention_layernorm.weight": norm(block.norm_2),
            f"{prefix}.mlp.gate_proj.weight": mlp.gate.weight,
            f"{prefix}.mlp.up_proj.weight": mlp.up.weight,
            f"{prefix}.mlp.down_proj.weight": mlp.proj.weight,
        }
    return tensors


def hf_tensors(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights as float32 CPU tensors under the names of its :func:`family`'s model."""
    gpt2 = family(model.cfg) == "gpt2"
    tensors = _gpt2_tensors(model) if gpt2 else _llama_tensors(model)
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}


def to_hf(model: Transformer) -> transformers.PreTrainedModel:
    """A float32 Hugging Face causal LM (on the CPU, in eval mode) with ``model``'s weights;
    a ConfigError, naming the field, for a configuration no architecture here matches."""
    config = hf_config(model.cfg)
    classes = {
        "gpt2": transformers.GPT2LMHeadModel,
        "llama": transformers.LlamaForCausalLM,
        "smollm3": transformers.SmolLM3ForCausalLM,
    }
    hf = classes[config.model_type](config).float()
    hf.load_state_dict(hf_tensors(model), strict=True)
    return hf.eval()


@torch.no_grad()
def max_logit_difference(
    model: Transformer, hf: transformers.PreTrainedModel, seed: int = 0
) -> float:
    """Max |Δlogit| between ``model`` and ``hf`` on random tokens, over max(1, max |logit|)."""
    native = copy.deepcopy(model).to("cpu", torch.float32).eval()
    T = min(model.cfg.max_seq_len, 32)
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.cfg.vocab_size, (2, T), generator=generator)
    expected = native(idx)
    got = hf(input_ids=idx).logits
    return ((got - expected).abs().max() / expected.abs().max().clamp(min=1)).item()


def export(model: Transformer, out: Path, seed: int = 0) -> transformers.PreTrainedModel:
    """Convert ``model`` with :func:`to_hf`, check its logits match, save it to ``out``.

    ``seed`` draws the check batch. A mismatch is a RuntimeError (a bug here, not bad input).
    """
    hf = to_hf(model)
    difference = max_logit_difference(model, hf, seed)
    if not difference <= TOLERANCE:
        raise RuntimeError(
            f"export: the {hf.config.model_type} model's logits differ from the native model's "
            f"by {difference:.3g} (relative; allowed {TOLERANCE:g})"
        )
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar for one small file is noise (junk in a log file)
    try:
        hf.save_pretrained(out)
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
    return hf


README = """# {folder}

A `{arch}` exported by `nopelab export` from the training run `{run}`
(pos_encoding {pos}{nope}, norm {norm}, mlp {mlp}, {layers} layers, d_model {d}).

```python
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("{folder}")
```
{notes}"""

TOKENIZER_NOTE = """
The tokenizer is nopelab's own (`nopelab_tokenizer.json`), not a `transformers` tokenizer:

```python
from pathlib import Path

from nopelab.training.tokenizer import tokenizer_from_json

tokenizer = tokenizer_from_json((Path("{folder}") / "nopelab_tokenizer.json").read_text())
ids = tokenizer.encode("some text")
```
"""

NO_TOKENIZER_NOTE = """
The run was trained on a synthetic task: token ids are `nopelab.training.tasks.encode(text)`
(the id of a character is its index in `nopelab.training.task_config.VOCAB`).
"""

NOPE_GPT2_NOTE = """
This is a NoPE model: its position table `wpe` is all zeros and must stay zero. Freeze it
before fine-tuning: `model.transformer.wpe.weight.requires_grad_(False)`. Like every GPT-2 it
takes at most {max_seq_len} positions (`n_positions`).
"""


def export_run(run_dir: Path, out: Path, seed: int = 0, shown_as: Path | None = None) -> str:
    """Export a training run's model into ``out``, with its tokenizer and a README.

    ``shown_as``: the folder the README tells users to load (default ``out``; differs when
    ``out`` is a staging folder). Returns the architecture: ``gpt2``, ``llama`` or ``smollm3``.
    """
    from nopelab.training.trained import load_trained

    run, model = load_trained(run_dir)
    hf = export(model, out, seed)
    name = hf.config.model_type
    tokenizer = run_dir / "tokenizer.json"
    if tokenizer.is_file():
        shutil.copyfile(tokenizer, out / "nopelab_tokenizer.json")
        notes = TOKENIZER_NOTE
    else:
        notes = NO_TOKENIZER_NOTE
    cfg = run.model
    if name == "gpt2" and encoding(cfg.pos_encoding).level == "none":
        notes += NOPE_GPT2_NOTE
    folder = str(shown_as or out)
    nope = f", nope_layers {list(cfg.nope_layers)}" if cfg.nope_layers else ""
    (out / "README.md").write_text(
        README.format(
            folder=folder,
            arch=type(hf).__name__,
            run=run_dir,
            pos=cfg.pos_encoding,
            nope=nope,
            norm=cfg.norm,
            mlp=cfg.mlp,
            layers=cfg.n_layers,
            d=cfg.d_model,
            notes=notes.format(folder=folder, max_seq_len=cfg.max_seq_len),
        )
    )
    return name
