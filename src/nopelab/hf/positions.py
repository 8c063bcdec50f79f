"""Which layers of a Hugging Face model use position: measured from behaviour, not read.

Config fields cannot be trusted for this (SmolLM3's ``no_rope_layers`` means "1 = apply RoPE",
and a released config is said to have it inverted), so :func:`position_use` asks the model:
every attention module is fed the *same* hidden states twice, once at positions 0..T-1 and once
at stretched positions 1, 4, 7, ...; a layer whose output changes applies a positional encoding
inside attention. A uniform shift would not do: RoPE depends only on offsets, which a shift
keeps. The causal mask is the same in both passes (it follows the sequence order, not the
position ids). Layer 0 reports whether the input embedding itself depends on position
(GPT-2's learned table).

:func:`rope_off` switches RoPE off in chosen layers by handing their attention the identity
rotation (cos = 1, sin = 0), which turns them into NoPE layers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from nopelab.errors import ConfigError
from nopelab.hf.sites import HFModel
from nopelab.measure.sites import SiteKey

TOLERANCE = 1e-5  # relative change below which a layer counts as position-free
STRETCH = 3


@dataclass(frozen=True)
class PositionUse:
    """Whether one layer's output depends on the position ids (layer 0: the input embedding)."""

    layer: int
    uses_position: bool
    change: float  # ||out(stretched) - out(natural)|| / ||out(natural)||


def _stretched_positions(model: HFModel, seq_len: int) -> tuple[int, Tensor, Tensor]:
    config = model.hf.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)
    T = min(seq_len, max((limit - 1) // STRETCH, 2)) if limit else seq_len
    natural = torch.arange(T)[None]
    return T, natural, 1 + STRETCH * natural


@torch.inference_mode()
def position_use(
    model: HFModel, seq_len: int = 32, seed: int = 0, tolerance: float = TOLERANCE
) -> list[PositionUse]:
    """Per layer (0 = embedding, 1..L = attention), whether the output depends on positions."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    T, natural, stretched = _stretched_positions(model, seq_len)
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(model.cfg.vocab_size, (1, T), generator=generator).to(device)
    x = torch.randn(1, T, model.cfg.d_model, generator=generator).to(device, dtype)
    outputs = []
    sites = [("embed", 0)] + [("attn_out", layer) for layer in range(1, model.cfg.n_layers + 1)]
    for positions in (natural, stretched):
        seen: dict[int, Tensor] = {}

        def keep(key: SiteKey, h: Tensor, seen: dict[int, Tensor] = seen) -> None:
            seen[key[1]] = h.clone()

        handles = model.observe(sites, keep)
        for attn in model.attention_modules():  # every attention reads the same x
            handles.append(attn.register_forward_pre_hook(_feed(x), with_kwargs=True))
        try:
            model(idx, position_ids=positions.to(device))
        finally:
            for handle in handles:
                handle.remove()
        outputs.append(seen)
    result = []
    for layer in sorted(outputs[0]):
        a, b = outputs[0][layer].float(), outputs[1][layer].float()
        change = float((b - a).norm() / a.norm().clamp_min(1e-30))
        result.append(PositionUse(layer, change > tolerance, change))
    return result


def write_position_use(out: Path, use: list[PositionUse]) -> None:
    """Add the measurement to an analysis run directory: ``position_use.parquet``, a
    ``position_use`` list in ``summary.json`` and a section of ``summary.md``."""
    from nopelab.runtime.rundir import write_json
    from nopelab.tables import markdown_table

    frame = pd.DataFrame([asdict(u) for u in use])
    frame.to_parquet(out / "position_use.parquet", index=False)
    summary = json.loads((out / "summary.json").read_text())
    summary["position_use"] = frame.to_dict(orient="records")
    write_json(out / "summary.json", summary)
    rope = [u.layer for u in use if u.layer and u.uses_position]
    with (out / "summary.md").open("a") as f:
        f.write(
            "\n## Which layers use position (measured)\n\n"
            f"Attention applies a positional encoding in {len(rope)} of {len(use) - 1} layers"
            f"{': ' + ', '.join(map(str, rope)) if rope else ''}; the input embedding "
            f"{'depends' if use[0].uses_position else 'does not depend'} on position. "
            "`change` is the relative change of a layer's output when the same inputs are "
            "presented at stretched positions (layer 0: the embedding).\n\n"
            f"{markdown_table(frame)}\n"
        )


def _feed(x: Tensor):
    def hook(module, args, kwargs):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": x}
        return (x, *args[1:]), kwargs

    return hook


def switch_rope_off(model: HFModel, layers: Iterable[int]) -> list[RemovableHandle]:
    """From now on, the attention of ``layers`` (1-based) gets the identity rotation; remove the
    returned hooks to undo it."""
    layers = sorted(set(layers))
    if not model.arch.rope:
        raise ConfigError(
            "rope_off", f"{model.cfg.model_type} has no rotary position embedding to switch off"
        )
    for layer in layers:
        if not 1 <= layer <= model.cfg.n_layers:
            raise ConfigError("rope_off", f"layer {layer} is outside 1..{model.cfg.n_layers}")
    modules = model.attention_modules()
    return [
        modules[layer - 1].register_forward_pre_hook(_identity_rotation, with_kwargs=True)
        for layer in layers
    ]


@contextmanager
def rope_off(model: HFModel, layers: Iterable[int]) -> Iterator[None]:
    """Inside the block, the attention of ``layers`` (1-based) gets the identity rotation."""
    handles = switch_rope_off(model, layers)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _identity_rotation(module, args, kwargs):
    rotation = kwargs.get("position_embeddings")
    if rotation is None:
        raise RuntimeError(f"{type(module).__name__} was not given position_embeddings")
    identity: tuple[torch.Tensor, torch.Tensor] | torch.Tensor
    if isinstance(rotation, tuple):  # (cos, sin)
        cos, sin = rotation
        identity = (torch.ones_like(cos), torch.zeros_like(sin))
    else:  # complex rotation factors (Llama 4)
        identity = torch.ones_like(rotation)
    return args, {**kwargs, "position_embeddings": identity}
