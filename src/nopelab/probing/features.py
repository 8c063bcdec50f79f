"""Activations collected for probing, and the feature sets derived from them.

Probing is the one place where nopelab stores activations, and then only for the chosen sites:
:func:`collect` writes them into :class:`Activations`, in memory or, past a memory budget, in
memory-mapped files that are deleted afterwards. :func:`feature_matrix` turns one site's
activations ``(N, T, d)`` into the per-token features a probe sees:

- ``raw``: the vector itself (d values);
- ``norm``: log ‖h_t‖ (1 value; the log is monotone, so it holds the same information and is
  easier for a small probe to use);
- ``variance``: log of the per-position variance over coordinates (Chi et al.; 1 value);
- ``cos_last``: cosine similarity to the sequence's last token (Zuo et al.; 1 value);
- ``cos_row``: the token's cosine similarities to every other token of its sequence, sorted, as
  :data:`ROW_QUANTILES` evenly spaced order statistics. Sorting keeps how similar the neighbours
  are and drops where they sit: the raw row would give position away through the index of its
  diagonal, whatever the model does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from nopelab.config import feature_names
from nopelab.errors import RunFailed
from nopelab.measure.sites import SiteKey, sites_of
from nopelab.models.transformer import Transformer

if TYPE_CHECKING:
    from nopelab.hf.sites import HFModel

ROW_QUANTILES = 32
EPS = 1e-30


class Activations:
    """``(N, T, d)`` float32 activations per (site, layer), in memory or memory-mapped.

    ``shapes`` maps each key to its ``(N, T, d)``. Use as a context manager when memory-mapped,
    so that the files are removed.
    """

    def __init__(self, shapes: dict[SiteKey, tuple[int, int, int]], memory_gb: float):
        self.keys = list(shapes)
        need = sum(int(np.prod(shape)) for shape in shapes.values()) * 4
        self._tmp = (
            tempfile.TemporaryDirectory(prefix="nopelab-features-")
            if need > memory_gb * 2**30
            else None
        )
        self.arrays: dict[SiteKey, np.ndarray] = {}
        for (site, layer), shape in shapes.items():
            if self._tmp is None:
                self.arrays[(site, layer)] = np.empty(shape, dtype=np.float32)
            else:
                path = Path(self._tmp.name) / f"{site}-{layer}.npy"
                self.arrays[(site, layer)] = np.lib.format.open_memmap(
                    path, mode="w+", dtype=np.float32, shape=shape
                )

    @property
    def memory_mapped(self) -> bool:
        return self._tmp is not None

    def __getitem__(self, key: SiteKey) -> Tensor:
        return torch.from_numpy(self.arrays[key])

    def __enter__(self) -> Activations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.arrays.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@torch.inference_mode()
def collect(
    model: Transformer | HFModel,
    keys: list[SiteKey],
    batches: Iterator[dict[str, Tensor]],
    samples: int,
    seq_len: int,
    memory_gb: float = 4.0,
    advance=None,
) -> Activations:
    """Run ``batches`` through ``model`` and keep the activations of ``keys``.

    ``model`` is already on its device and dtype; ``advance(n)`` reports progress. The store is
    sized by the first batch: ``attn_heads`` (heads × head_dim) need not be ``d_model`` wide.
    """
    param = next(model.parameters())
    store: Activations | None = None
    row = 0
    current: dict[SiteKey, Tensor] = {}
    handles = sites_of(model).observe(keys, current.__setitem__)
    try:
        for batch in batches:
            inputs = {k: v.to(param.device) for k, v in batch.items()}
            if "inputs_embeds" in inputs:
                inputs["inputs_embeds"] = inputs["inputs_embeds"].to(param.dtype)
            model(**inputs)
            n = len(next(iter(inputs.values())))
            if row + n > samples:
                raise ValueError(f"the batches hold more than the {samples} sequences asked for")
            if store is None:
                shapes = {key: (samples, seq_len, current[key].shape[-1]) for key in keys}
                store = Activations(shapes, memory_gb)
            for key in keys:
                if not current[key].isfinite().all():
                    raise RunFailed(
                        f"the activations at {key[0]} layer {key[1]} are not finite (NaN or "
                        "inf): check the weights and --init-std, or probe in --dtype float32"
                    )
                store.arrays[key][row : row + n] = current[key].float().cpu().numpy()
            row += n
            if advance is not None:
                advance(n)
    finally:
        for handle in handles:
            handle.remove()
    if store is None:
        raise ValueError("collect needs at least one batch")
    return store


def feature_matrix(acts: Tensor, combination: str, chunk: int = 64) -> Tensor:
    """Per-token features ``(N, T, F)`` of one site's activations ``(N, T, d)``."""
    names = feature_names(combination)
    if names == ("raw",):
        return acts
    parts = [
        torch.cat([_feature(acts[i : i + chunk].float(), name) for name in names], dim=-1)
        for i in range(0, len(acts), chunk)
    ]
    return torch.cat(parts)


def _feature(h: Tensor, name: str) -> Tensor:
    if name == "raw":
        return h
    if name == "norm":
        return h.norm(dim=-1, keepdim=True).clamp_min(EPS).log()
    if name == "variance":
        return h.var(dim=-1, unbiased=False, keepdim=True).clamp_min(EPS).log()
    unit = torch.nn.functional.normalize(h, dim=-1)
    if name == "cos_last":
        return (unit * unit[:, -1:]).sum(-1, keepdim=True)
    return sorted_similarities(unit)


def sorted_similarities(unit: Tensor, quantiles: int = ROW_QUANTILES) -> Tensor:
    """For unit vectors ``(N, T, d)``: each token's similarities to the other T−1 tokens,
    sorted in descending order, at ``quantiles`` evenly spaced ranks ``(N, T, K)``."""
    T = unit.shape[1]
    sims = unit @ unit.transpose(1, 2)
    sims.diagonal(dim1=1, dim2=2).fill_(float("inf"))  # sorts first, then dropped
    ordered = sims.sort(dim=-1, descending=True).values[..., 1:]
    ranks = torch.linspace(0, T - 2, min(quantiles, T - 1)).round().long()
    return ordered[..., ranks]
