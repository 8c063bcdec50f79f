"""Probe a model: collect the chosen sites' activations, derive feature sets, fit probes.

:func:`probe_model` is what ``nopelab probe`` and ``nopelab compare-signals`` run; it returns
one row per (site, layer, features, probe) with the seed mean and spread of each metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nopelab.config import ATTENTION, SITES, AnalysisConfig, ProbeConfig
from nopelab.errors import ConfigError
from nopelab.measure.analysis import input_batches
from nopelab.measure.sites import SiteKey
from nopelab.models.transformer import Transformer
from nopelab.probing.features import Activations, collect, feature_matrix
from nopelab.probing.probes import (
    Split,
    fit_probe,
    fixed_splits,
    position_targets,
    sequence_splits,
    summarize,
    test_count,
)
from nopelab.runtime.device import resolve_device
from nopelab.runtime.progress import progress as show_progress

if TYPE_CHECKING:
    from nopelab.hf.load import TextWindows
    from nopelab.hf.sites import HFModel
    from nopelab.training.sources import Source


def check_probe_sites(sites: tuple[str, ...]) -> None:
    """A ConfigError for the site ``attention``: probes read activation vectors."""
    if ATTENTION in sites:
        raise ConfigError(
            "sites",
            "probes read activation vectors; attention is a pattern, not a vector "
            f"(allowed: {', '.join(SITES)})",
        )


def probe_keys(
    model: Transformer | HFModel, sites: tuple[str, ...], layers: tuple[int, ...]
) -> list[SiteKey]:
    """The (site, layer) pairs to probe: ``embed`` is layer 0, block sites are 1..L; an empty
    ``layers`` means all. A requested layer that none of the sites has is an error."""
    check_probe_sites(sites)
    L = model.cfg.n_layers
    available = [
        (site, layer) for site in sites for layer in ([0] if site == "embed" else range(1, L + 1))
    ]
    if not layers:
        return available
    for layer in layers:
        if not any(key[1] == layer for key in available):
            raise ConfigError(
                "probe.layers",
                f"layer {layer} does not exist for sites {', '.join(sites)} "
                f"(embed is layer 0, block sites are 1..{L})",
            )
    return [key for key in available if key[1] in layers]


def vocab_halves(vocab_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """The vocabulary split in two at random: training tokens and held-out tokens."""
    order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed + 2))
    half = vocab_size // 2
    return order[:half].sort().values, order[half:].sort().values


def _vocab_batches(
    ids: Tensor, n: int, seq_len: int, batch_size: int, generator: torch.Generator
) -> Iterator[dict[str, Tensor]]:
    for start in range(0, n, batch_size):
        B = min(batch_size, n - start)
        yield {"idx": ids[torch.randint(len(ids), (B, seq_len), generator=generator)]}


def collect_for_probes(
    model: Transformer | HFModel,
    keys: list[SiteKey],
    analysis: AnalysisConfig,
    probe: ProbeConfig,
    source: Source | TextWindows | None = None,
    description: str = "probe",
    progress: bool = True,
) -> tuple[Activations, list[Split]]:
    """Activations of ``keys`` for ``analysis.samples`` sequences, and the splits to probe them.

    ``split = "vocab"`` builds the training sequences from one half of the vocabulary and the
    test sequences from the other (Zuo et al.); it needs token inputs.
    """
    if probe.split == "vocab" and analysis.input != "tokens":
        raise ConfigError(
            "split",
            f"vocab builds sequences from token ids; needs input tokens, not {analysis.input}",
        )
    n = analysis.samples
    if probe.split == "sequences":
        splits = sequence_splits(n, probe.test_fraction, probe.seeds, analysis.seed)
        batches = input_batches(model.cfg, analysis, source)
    else:
        n_test = test_count(n, probe.test_fraction)
        train_ids, test_ids = vocab_halves(model.cfg.vocab_size, analysis.seed)
        generator = torch.Generator().manual_seed(analysis.seed + 1)
        T, B = analysis.seq_len, analysis.batch_size
        batches = _chain(
            _vocab_batches(train_ids, n - n_test, T, B, generator),
            _vocab_batches(test_ids, n_test, T, B, generator),
        )
        splits = fixed_splits(torch.arange(n - n_test), torch.arange(n - n_test, n), probe.seeds)
    line = (
        f"{description}: collecting {n} samples at T={analysis.seq_len}, "
        f"{len(keys)} sites and layers"
    )
    with show_progress(line, n, progress, label=f"{description}: collect") as advance:
        acts = collect(model, keys, batches, n, analysis.seq_len, probe.memory_gb, advance)
    return acts, splits


def _chain(*iterators: Iterator) -> Iterator:
    for iterator in iterators:
        yield from iterator


def probe_model(
    model: Transformer | HFModel,
    analysis: AnalysisConfig,
    probe: ProbeConfig,
    source: Source | TextWindows | None = None,
    description: str = "probe",
    progress: bool = True,
    labels: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Fit every probe on every feature set at every chosen (site, layer) of ``model``.

    Returns one row per fit, with ``labels`` first, then ``layer``, ``site``, ``probe``,
    ``features``, the metrics' seed means (``mad`` and ``accuracy`` for classifiers, ``mae`` and
    ``r`` for regressors), ``baseline`` (the error of predicting the middle) and ``NAME_std``.
    """
    device = resolve_device(analysis.device)
    model = model.to(device=device, dtype=getattr(torch, analysis.dtype)).eval()
    keys = probe_keys(model, analysis.sites, probe.layers)
    acts, splits = collect_for_probes(model, keys, analysis, probe, source, description, progress)
    targets = position_targets(analysis.samples, analysis.seq_len, probe.target)
    rows = []
    fits = len(keys) * len(probe.features) * len(probe.probes)
    line = f"{description}: fitting {fits} probes, {probe.seeds} seeds each"
    with acts, show_progress(line, fits, progress, label=f"{description}: fit") as advance:
        for site, layer in keys:
            for combination in probe.features:
                features = feature_matrix(acts[(site, layer)], combination)
                for kind in probe.probes:
                    results = fit_probe(
                        kind,
                        features,
                        targets,
                        splits,
                        probe,
                        analysis.seed,
                        device,
                        label=f"features {combination} at {site} layer {layer}",
                    )
                    rows.append(
                        {
                            **(labels or {}),
                            "layer": layer,
                            "site": site,
                            "probe": kind,
                            "features": combination,
                            "target": probe.target,
                            "split": probe.split,
                            **summarize(results),
                        }
                    )
                    advance(1)
    return rows
