"""Causal interventions: edit one site of a trained model and see what its behaviour loses.

At a chosen (site, layer) a forward hook replaces every token's activation h by f(h). Each f is
fitted on that site's activations for ``fit_samples`` held-out sequences and never looks at the
position index, so it applies to any input length (greedy decoding grows the input):

- ``equalize-norm``: h ← h · c/‖h‖, with c the mean token norm of the fit set. Directions are
  unchanged, so every cosine similarity is too; the norm (and variance) signal is gone.
- ``shuffle-norm`` (its control): h ← h · f with f drawn i.i.d. per token (afresh at every
  forward pass) from the fit set's values of c/‖h‖: the same distribution of rescalings, not
  tied to position.
- ``leace``: LEACE (Belrose et al. 2023, ``concept-erasure``) fitted on (activations, position).
  Concept ``onehot`` erases every linearly decodable position class: up to T−1 directions,
  most of the space when T is close to d, which can wreck a small model whatever it aims at;
  ``scalar`` erases what a linear regression of the position can use (one direction).
- ``leace-shuffled`` (a control): LEACE fitted on the same activations with the position labels
  permuted across tokens: the same kind and rank of edit, not aimed at position. In whitened
  coordinates both remove the same number of dimensions; their Euclidean sizes (the ``size``
  column, mean ‖Δh‖/‖h‖ on the fit set) can differ by several times.
- ``leace-rotated`` (the size-matched control): LEACE's own edit Δ = f(h) − h turned by a fixed
  random rotation Q, h ← h + QΔ. Every token moves exactly as far as under LEACE, but the map
  h ↦ (I − QP)h + const is invertible (P the erased projection), so no information is lost.

LEACE is linear erasure: after it no linear probe beats a constant guess on the fit set, and on
held-out sequences only the fitting error is left (it shrinks as ``fit_samples`` grows). Position
carried non-linearly, e.g. by the norm, survives: an MLP probe may still read it. On synthetic
activations whose norm shrinks like 1/sqrt(t) (tests/unit/probing/test_interventions.py), a linear classifier
falls to chance after LEACE while an MLP regressor keeps r ≈ 0.5.

:func:`run_interventions` measures, per layer and intervention, the behaviour of a trained run
(task accuracy or text loss) and the position probes downstream; :func:`verdict` compares each
intervention with its control; :func:`write_interventions` writes the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from nopelab import plots
from nopelab.config import (
    SITES,
    AnalysisConfig,
    InterventionConfig,
    ModelConfig,
    ProbeConfig,
    build,
    check_sections,
)
from nopelab.errors import ConfigError, UserError
from nopelab.extras import need
from nopelab.limits import check_interventions
from nopelab.measure.analysis import input_batches
from nopelab.measure.sites import SiteKey, sites_of
from nopelab.models.transformer import Transformer
from nopelab.probing.features import EPS, collect, feature_matrix
from nopelab.probing.probes import Split, fit_probe, position_targets, sequence_splits, summarize
from nopelab.runtime.device import resolve_device
from nopelab.runtime.progress import progress as show_progress
from nopelab.runtime.progress import stage
from nopelab.runtime.rundir import environment, write_json
from nopelab.tables import markdown_table
from nopelab.training.run import read_run
from nopelab.training.sources import Source, TaskSource, TextSource
from nopelab.training.trained import load_trained, make_source

# LEACE keeps directions whose whitened cross-covariance singular value exceeds this; the
# library's default (0.01) would drop most of the noise directions the shuffled control is
# fitted on, so the control would remove fewer directions than LEACE itself.
SVD_TOL = 1e-6
CONTROLS = {"shuffle-norm": "equalize-norm", "leace-shuffled": "leace", "leace-rotated": "leace"}
# signal -> (intervention, its controls); the verdict measures against the most harmful control
SIGNALS = {
    "norm": ("equalize-norm", ("shuffle-norm",)),
    "position": ("leace", ("leace-rotated", "leace-shuffled")),
}


class Intervention(Protocol):
    def __call__(self, h: Tensor) -> Tensor:
        """``(..., d)`` activations in, edited activations of the same shape out."""


@dataclass
class EqualizeNorm:
    """Every token rescaled to the norm ``norm``."""

    norm: float

    def __call__(self, h: Tensor) -> Tensor:
        return h * (self.norm / h.norm(dim=-1, keepdim=True).clamp_min(EPS))


class ShuffleNorm:
    """Every token rescaled by a factor drawn at random from ``factors``."""

    def __init__(self, factors: Tensor, seed: int):
        self.factors = factors
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, h: Tensor) -> Tensor:
        picks = torch.randint(len(self.factors), h.shape[:-1], generator=self.generator)
        return h * self.factors[picks].to(h.device, h.dtype)[..., None]


@dataclass
class Erase:
    """The affine LEACE map h ← h − (h − bias) · rightᵀ · leftᵀ."""

    left: Tensor  # (d, k)
    right: Tensor  # (k, d)
    bias: Tensor  # (d,)

    def __call__(self, h: Tensor) -> Tensor:
        left, right, bias = (t.to(h.device, h.dtype) for t in (self.left, self.right, self.bias))
        return h - ((h - bias) @ right.T) @ left.T


@dataclass
class Rotated:
    """Another intervention's edit turned by a fixed rotation: h ← h + (edit(h) − h) · Qᵀ."""

    edit: Intervention
    rotation: Tensor  # (d, d) orthogonal

    def __call__(self, h: Tensor) -> Tensor:
        return h + (self.edit(h) - h) @ self.rotation.to(h.device, h.dtype).T


def random_rotation(d: int, seed: int) -> Tensor:
    """A Haar-random orthogonal (d, d) matrix (QR of a Gaussian, signs fixed)."""
    gaussian = torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    return (q * torch.sign(torch.diagonal(r))).float()


def fit_intervention(
    name: str, acts: Tensor, concept: str = "onehot", seed: int = 0
) -> Intervention:
    """Fit intervention ``name`` on one site's activations ``(N, T, d)``."""
    N, T, d = acts.shape
    x = acts.reshape(N * T, d).double()
    if name in ("equalize-norm", "shuffle-norm"):
        norms = x.norm(dim=-1)
        if name == "equalize-norm":
            return EqualizeNorm(float(norms.mean()))
        return ShuffleNorm((norms.mean() / norms.clamp_min(EPS)).float(), seed)
    if name == "leace-rotated":
        return Rotated(fit_intervention("leace", acts, concept, seed), random_rotation(d, seed))
    positions = torch.arange(T).repeat(N)
    if name == "leace-shuffled":
        order = torch.randperm(N * T, generator=torch.Generator().manual_seed(seed))
        positions = positions[order]
    z = F.one_hot(positions, T) if concept == "onehot" else positions[:, None]
    erasure = need("concept_erasure", "--intervention leace")
    fitter = erasure.LeaceFitter(d, z.shape[1], dtype=torch.float64, svd_tol=SVD_TOL)
    eraser = fitter.update(x, z.double()).eraser
    return Erase(eraser.proj_left.float(), eraser.proj_right.float(), eraser.bias.float())


@torch.no_grad()
def edit_size(intervention: Intervention, acts: Tensor, chunk: int = 64) -> float:
    """Mean over tokens of ‖f(h) − h‖ / ‖h‖ on activations ``(N, T, d)``."""
    total, count = 0.0, 0
    for i in range(0, len(acts), chunk):
        h = acts[i : i + chunk].float()
        ratio = (intervention(h) - h).norm(dim=-1) / h.norm(dim=-1).clamp_min(EPS)
        total, count = total + float(ratio.sum()), count + ratio.numel()
    return total / count


def check_place(model: ModelConfig, site: str, layer: int) -> None:
    """A ConfigError unless the model has ``site`` at ``layer``."""
    if site not in SITES:
        raise ConfigError("site", f"unknown value {site!r}; allowed: {', '.join(SITES)}")
    if site == "embed" and layer != 0:
        raise ConfigError("layers", f"site embed has only layer 0, got {layer}")
    if site != "embed" and not 1 <= layer <= model.n_layers:
        raise ConfigError(
            "layers", f"the model has no layer {layer} at site {site} (layers 1..{model.n_layers})"
        )


@contextlib.contextmanager
def applied(
    model: Transformer, site: str, layer: int, intervention: Intervention
) -> Iterator[None]:
    """Within the block, ``intervention`` replaces the activations at (site, layer)."""
    check_place(model.cfg, site, layer)

    handle = sites_of(model).edit((site, layer), lambda h: intervention(h.float()).to(h.dtype))
    try:
        yield
    finally:
        handle.remove()


# ------------------------------------------------------------------------ a trained run


@dataclass(frozen=True)
class InterventionSettings:
    """What ``nopelab intervene`` runs: the edit, the held-out sequences, the probes."""

    intervention: InterventionConfig
    analysis: AnalysisConfig
    probe: ProbeConfig

    def to_dict(self, run_dir: Path) -> dict[str, Any]:
        tables = {
            f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)
        }
        return {"run": str(run_dir), **tables}


def intervention_settings(run_dir: Path, data: dict[str, Any]) -> InterventionSettings:
    """The [intervention], [analysis] and [probe] tables of ``data`` (a config file's, with the
    flags laid over them), validated; [analysis] defaults to the run's own data
    (``input = "data"``) at its training length (``seq_len``)."""
    check_sections(data, ("intervention", "analysis", "probe"))
    analysis = {"seq_len": read_run(run_dir).train.seq_len, "input": "data"}
    return InterventionSettings(
        build(InterventionConfig, data.get("intervention", {}), "config.intervention"),
        build(AnalysisConfig, {**analysis, **data.get("analysis", {})}, "config.analysis"),
        build(ProbeConfig, data.get("probe", {}), "config.probe"),
    )


def run_interventions(
    run_dir: Path,
    cfg: InterventionConfig,
    probe: ProbeConfig,
    analysis: AnalysisConfig,
    *,
    eval_tokens: int = 16384,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Intervene at every chosen layer of the trained run in ``run_dir``.

    ``analysis`` gives the length (``seq_len``, best the run's training length) and number
    (``samples``) of the held-out sequences that the probes see, and the seed, device and dtype;
    the fit set is ``cfg.fit_samples`` other held-out sequences of the same length. ``probe``
    gives the probes, feature sets and seeds (its ``layers`` are ignored: probes sit at the
    intervened site and at the last layer's ``resid_post``). The behaviour is the run's own
    evaluation on at most ``cfg.eval_samples`` test examples (task) or ``eval_tokens`` held-out
    tokens per length (text). Interventions whose fitting would not fit in memory are refused
    first (:func:`~nopelab.limits.check_interventions`).

    Returns one row per layer and intervention, plus an unmodified row (``intervention`` none):
    ``layer``, ``site``, ``intervention``, ``control_of``, ``concept``, ``size`` (mean
    ‖Δh‖/‖h‖ on the fit set), ``metric`` (``accuracy`` for a task, ``loss`` for text), ``delta``
    (its change against the unmodified model), ``se`` (its standard error from the evaluation's
    sampling), every metric the evaluation returns, ``probe_baseline`` and probe columns
    ``{where}_{probe}_{features}_{mad|accuracy|mae|r}`` with ``where`` ``site`` or ``final``.
    """
    if probe.split != "sequences":
        raise ConfigError("split", "interventions probe held-out sequences; use split sequences")
    run, model = load_trained(run_dir)
    if run.corpus is not None and run.corpus.objective == "masked":
        raise UserError(
            f"run: interventions measure a causal model's behaviour; {run_dir} is a masked LM"
        )
    analysis.check_model(run.model)
    L = run.model.n_layers
    layers = cfg.layers or ((0,) if cfg.site == "embed" else tuple(range(1, L + 1)))
    for layer in layers:
        check_place(run.model, cfg.site, layer)
    check_interventions(run.model, cfg, analysis.seq_len, len(layers), probe.memory_gb)
    device = resolve_device(analysis.device)
    model = model.to(device=device, dtype=getattr(torch, analysis.dtype)).eval()
    small = dataclasses.replace(
        run.train,
        eval_samples=min(cfg.eval_samples, run.train.eval_samples),
        eval_tokens=min(eval_tokens, run.train.eval_tokens),
    )
    source = make_source(dataclasses.replace(run, train=small), run_dir)
    seq_len = run.train.seq_len

    def behaviour() -> dict[str, float]:
        return source.evaluate(model, seq_len, False, device, contextlib.nullcontext)

    if progress:
        stage("intervene: the unmodified model's behaviour")
    metrics = behaviour()
    metric = "accuracy" if "accuracy" in metrics else "loss"
    standard_error = _standard_error(metric, source, model, seq_len, device, analysis.seed)

    T, n = analysis.seq_len, analysis.samples
    splits = sequence_splits(n, probe.test_fraction, probe.seeds, analysis.seed)
    targets = position_targets(n, T, probe.target)
    baseline = float(
        sum((targets[s.test] - targets[s.train].double().median()).abs().mean() for s in splits)
        / len(splits)
    )  # predicting the training median, as the probes' own baseline
    final: SiteKey = ("resid_post", L)

    def probes_at(keys: list[SiteKey], line: str = "") -> dict[SiteKey, dict[str, float]]:
        """Probes at each of ``keys``; with a ``line``, shown as a stage of its own."""
        keys = list(dict.fromkeys(keys))
        batches = input_batches(run.model, dataclasses.replace(analysis, input="data"), source)
        fits = {}
        with (
            collect(model, keys, batches, n, T, probe.memory_gb) as acts,
            show_progress(line, len(keys), progress and bool(line)) as advance,
        ):
            for k in keys:
                fits[k] = _fit_probes(acts[k], probe, splits, targets, analysis.seed, device)
                advance(1)
        return fits

    def probe_columns(at: dict[SiteKey, dict[str, float]], key: SiteKey) -> dict[str, float]:
        """Probes at ``key`` (labelled site) and at the last layer (labelled final)."""
        columns = {"probe_baseline": baseline}
        for where, k in (("site", key), ("final", final)):
            columns.update({f"{where}_{name}": value for name, value in at[k].items()})
        return columns

    fit_generator = torch.Generator().manual_seed(analysis.seed + 2)  # probes use seed + 1
    fit_batches = (
        {"idx": source.held_out(min(analysis.batch_size, cfg.fit_samples - i), T, fit_generator)}
        for i in range(0, cfg.fit_samples, analysis.batch_size)
    )
    keys: list[SiteKey] = [(cfg.site, layer) for layer in layers]
    line = f"intervene: probing the unmodified model at {len(keys) + 1} sites and layers"
    unmodified = probes_at([*keys, final], line)
    rows = []
    total = len(layers) * (1 + len(cfg.interventions))
    line = f"intervene: {len(cfg.interventions)} intervention(s) at {len(layers)} layer(s), probed"
    with (
        collect(model, keys, fit_batches, cfg.fit_samples, T, probe.memory_gb) as fit,
        show_progress(line, total, progress, label="intervene") as advance,
    ):
        for key in keys:
            common = {"layer": key[1], "site": key[0], "concept": cfg.concept, "metric": metric}
            rows.append(
                {
                    **common,
                    "intervention": "none",
                    "control_of": None,
                    "size": 0.0,
                    "delta": 0.0,
                    "se": standard_error(metrics[metric]),
                    **metrics,
                    **probe_columns(unmodified, key),
                }
            )
            advance(1)
            for name in cfg.interventions:
                intervention = fit_intervention(name, fit[key], cfg.concept, analysis.seed)
                size = edit_size(intervention, fit[key])
                with applied(model, *key, intervention):
                    edited = behaviour()
                    columns = probe_columns(probes_at([key, final]), key)
                rows.append(
                    {
                        **common,
                        "intervention": name,
                        "control_of": CONTROLS.get(name),
                        "size": size,
                        "delta": edited[metric] - metrics[metric],
                        "se": standard_error(edited[metric]),
                        **edited,
                        **columns,
                    }
                )
                advance(1)
    return rows


def _fit_probes(
    acts: Tensor,
    probe: ProbeConfig,
    splits: list[Split],
    targets: Tensor,
    seed: int,
    device: torch.device,
) -> dict[str, float]:
    """Seed-mean metrics of every probe on every feature set, keyed ``{probe}_{features}_{m}``."""
    columns: dict[str, float] = {}
    for combination in probe.features:
        features = feature_matrix(acts, combination)
        for kind in probe.probes:
            summary = summarize(fit_probe(kind, features, targets, splits, probe, seed, device))
            names = ("mad", "accuracy") if kind.endswith("cls") else ("mae", "r")
            columns.update({f"{kind}_{combination}_{m}": summary[m] for m in names})
    return columns


def _standard_error(
    metric: str, source: Source, model: Transformer, seq_len: int, device: torch.device, seed: int
) -> Callable[[float], float]:
    """A function from a metric value to its standard error under the evaluation's sampling.

    Accuracy over n decoded examples: the binomial sqrt(p(1 − p)/n). Loss: the spread of the
    unmodified model's per-window loss over held-out windows, divided by sqrt(windows evaluated).
    """
    if metric == "accuracy":
        assert isinstance(source, TaskSource)  # only a task's evaluation reports accuracy
        n = min(source.eval_samples, len(source.test))
        return lambda p: math.sqrt(p * (1 - p) / n)
    assert isinstance(source, TextSource)  # loss alone: a text corpus
    ids = source.held_out(32, seq_len, torch.Generator().manual_seed(seed + 3)).to(device)
    with torch.no_grad():
        logits = model(ids[:, :-1]).float()
    losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(1)
    windows = min(max(1, source.eval_tokens // seq_len), (len(source.stream.val) - 1) // seq_len)
    spread = float(losses.std()) / math.sqrt(windows)
    return lambda value: spread


def verdict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer, which signal the behaviour depends on.

    For each signal (``norm``: equalize-norm against shuffle-norm; ``position``: leace against
    leace-rotated and leace-shuffled) the effect is the harm the intervention does beyond its
    most harmful control present (``{signal}_control``): the accuracy it loses, or the loss it
    adds, more than that control does. A signal counts when its effect exceeds two standard
    errors of the difference of the two evaluations (2·sqrt(se_i² + se_c²), treating them as
    independent, which is conservative since they share their examples). ``depends_on`` names
    the signals that count, the larger effect first, or ``neither``. ``{signal}_size_ratio`` is
    the intervention's size over that control's: far from 1, part of the effect may be the size
    of the edit rather than its aim (leace-rotated is 1 by construction).
    """
    by = {(r["layer"], r["intervention"]): r for r in rows}
    verdicts = []
    for layer in dict.fromkeys(r["layer"] for r in rows):
        base = by[(layer, "none")]
        sign = -1.0 if base["metric"] == "accuracy" else 1.0
        entry: dict[str, Any] = {"layer": layer, "site": base["site"], "metric": base["metric"]}
        counted = []
        for signal, (name, controls) in SIGNALS.items():
            present = [by[(layer, c)] for c in controls if (layer, c) in by]
            if (layer, name) not in by or not present:
                continue
            edit = by[(layer, name)]
            ctrl = max(present, key=lambda row: sign * row["delta"])  # the most harmful control
            entry[f"{signal}_control"] = ctrl["intervention"]
            effect = sign * (edit["delta"] - ctrl["delta"])
            margin = 2 * math.hypot(edit["se"], ctrl["se"])
            entry[f"{signal}_effect"], entry[f"{signal}_margin"] = effect, margin
            entry[f"{signal}_size_ratio"] = (
                edit["size"] / ctrl["size"] if ctrl["size"] else math.inf
            )
            if effect > margin:
                counted.append((effect, signal))
        entry["depends_on"] = "+".join(s for _, s in sorted(counted, reverse=True)) or "neither"
        verdicts.append(entry)
    return verdicts


# ------------------------------------------------------------------------ outputs


def write_interventions(
    out: Path,
    rows: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
    title: str = "",
) -> dict[str, Any]:
    """Write interventions.parquet, summary.json (``rows``, ``verdict``), summary.md,
    interventions.png and, given ``config``, config.json into ``out``; return the summary."""
    frame = pd.DataFrame(rows)
    verdicts = verdict(rows)
    summary = {"rows": rows, "verdict": verdicts}
    if config is not None:
        write_json(out / "config.json", {**config, "environment": environment()})
    write_json(out / "summary.json", summary)
    frame.to_parquet(out / "interventions.parquet", index=False)
    plots.intervention_effects(frame, out / "interventions.png", title)
    metric = frame["metric"].iloc[0]
    headline = [c for c in frame.columns if c.endswith(("_mad", "_mae"))]
    columns = ["layer", "intervention", "size", metric, "delta", "se", *headline]
    (out / "summary.md").write_text(
        f"# nopelab interventions{': ' + title if title else ''}\n\n"
        f"Site {frame['site'].iloc[0]}, concept {frame['concept'].iloc[0]}; "
        f"`delta` is the change in {metric} against the unmodified model.\n\n"
        f"{markdown_table(pd.DataFrame(verdicts))}\n\n"
        f"{markdown_table(frame[columns])}\n"
    )
    return summary
