"""Chi et al.'s probe of the random, frozen NoPE model, as a study: which probe, reading what,
from how many sequences, recovers position?

Chi et al. report that a random, frozen NoPE model "inherently encodes strong positional
information". The study probes their model (pre-LN, normal init σ = 0.02) crossing the input
(N(0, 1) vectors as in their Figure 1, or real text through the model's N(0, σ²) token
embeddings), the site (``attn_out``, ``resid_post``), the probe (ridge regression, a
one-hidden-layer ReLU MLP) and its features (the raw vector, its log norm, its log variance over
coordinates), at several counts of training sequences, per layer: mean absolute error on held-out
sequences against the baseline of predicting the middle (its MAE is T/4). Beside the probes, the squared norm
of the block input and of layer 1's attention output by position says how large the position
signal is against the vector it rides on.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from nopelab.config import CorpusConfig, ModelConfig, Probe, ProbeConfig
from nopelab.errors import UserError
from nopelab.experiments.chi2023 import figures
from nopelab.experiments.outputs import write_outputs
from nopelab.experiments.scale_files import read_scales, scale_schema
from nopelab.experiments.summary_template import fill, shape_values
from nopelab.limits import available_memory, size_text
from nopelab.measure.sites import SiteKey
from nopelab.models.transformer import build_model
from nopelab.probing.features import collect, feature_matrix
from nopelab.probing.probes import fit_probe, fixed_splits, position_targets, summarize
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import Job, default_workers, run_jobs
from nopelab.runtime.progress import progress, stage
from nopelab.runtime.rundir import replace_atomically
from nopelab.tables import markdown_table, mean_std

SIGMA = 0.02
INPUTS = ("random", "text")
INPUT_LABELS = {"random": "N(0, 1) vectors", "text": "text, N(0, σ²) token embeddings"}
SITES = ("attn_out", "resid_post")
PROBES: tuple[Probe, ...] = ("linear-reg", "mlp-reg")
FEATURES = ("raw", "norm", "variance")
MEMORY_GB = 2.0  # per input: activations beyond this go to memory-mapped files


@scale_schema
class Scale:
    d_model: int
    n_heads: int
    n_layers: int
    seq_len: int
    samples: list[int]  # training-sequence counts, increasing
    test_samples: int  # held-out sequences, the same for every count
    layers: list[int]
    batch_size: int
    epochs: int
    seeds: int


SCALES = read_scales("chi2023.probe_study", Scale)


@dataclass(frozen=True)
class Settings:
    model: ModelConfig
    seq_len: int
    samples: tuple[int, ...]
    test_samples: int
    layers: tuple[int, ...]
    batch_size: int
    probe: ProbeConfig
    seed: int
    device: str
    workers: int  # inputs collected and probed at once

    @property
    def sequences(self) -> int:
        """Sequences collected per input: the largest training count, then the test ones."""
        return max(self.samples) + self.test_samples


def settings(
    scale: str, seed: int, device: str, samples: tuple[int, ...] | None = None
) -> Settings:
    """The scale's study; ``samples`` (``--samples``) replaces its training-sequence counts."""
    s = SCALES[scale]
    resolve_device(device)
    counts = tuple(s.samples) if samples is None else samples
    check_samples(counts)
    model = ModelConfig(
        d_model=s.d_model,
        n_heads=s.n_heads,
        n_layers=s.n_layers,
        vocab_size=256,  # bytes
        max_seq_len=s.seq_len,
        pos_encoding="none",
        norm_position="pre",
        init="normal",
        init_std=SIGMA,
    )
    probe = ProbeConfig(
        probes=PROBES,
        features=FEATURES,
        seeds=s.seeds,
        epochs=s.epochs,
        memory_gb=MEMORY_GB,
    )
    study = Settings(
        model=model,
        seq_len=s.seq_len,
        samples=counts,
        test_samples=s.test_samples,
        layers=tuple(s.layers),
        batch_size=s.batch_size,
        probe=probe,
        seed=seed,
        device=device,
        workers=default_workers(device),
    )
    check_memory(study)
    return study


def check_samples(counts: tuple[int, ...]) -> None:
    """Training-sequence counts: at least one, each at least 2 (ridge holds one out to choose
    its penalty), increasing."""
    if not counts:
        raise UserError("--samples: give at least one count of training sequences, e.g. 32,256")
    if min(counts) < 2:
        raise UserError(f"--samples: each count must be at least 2, got {min(counts)}")
    if any(b <= a for a, b in itertools.pairwise(counts)):
        raise UserError(f"--samples: counts must increase, got {','.join(map(str, counts))}")


def activation_bytes(s: Settings) -> int:
    """Bytes of one site and layer's activations for one input (float32)."""
    return s.sequences * s.seq_len * s.model.d_model * 4


def check_memory(s: Settings) -> None:
    """Refuse a study whose activations do not fit: each input running at once keeps every probed
    site and layer (on disk past a budget) and one of them in memory while its probes fit."""
    at_once = min(s.workers, len(INPUTS))
    one = activation_bytes(s)
    stored = at_once * one * len(SITES) * (len(s.layers) + 1)
    fitting = at_once * 3 * one  # one site and layer, its moments' chunks and the gathers
    disk = shutil.disk_usage(tempfile.gettempdir()).free
    if fitting > available_memory() or stored > disk + available_memory():
        raise UserError(
            f"--samples: {max(s.samples)} training sequences of {s.seq_len} need "
            f"{size_text(fitting)} of memory and {size_text(stored)} of activations; this "
            f"machine has {size_text(available_memory())} free and {size_text(disk)} of disk "
            "in the temporary folder; use fewer"
        )


def _batches(s: Settings, kind: str) -> Iterator[dict[str, torch.Tensor]]:
    """The sequences of one input kind: the training ones, then the held-out ones.

    ``random``: N(0, 1) vectors. ``text``: byte windows of the embedded corpus; training windows
    at random from its training part, held-out windows one after another from its held-out
    tail, so no text is in both."""
    generator = torch.Generator().manual_seed(s.seed + 1)
    T, B = s.seq_len, s.batch_size
    n_train = max(s.samples)
    if kind == "random":
        for start in range(0, s.sequences, B):
            n = min(B, s.sequences - start)
            yield {"inputs_embeds": torch.randn(n, T, s.model.d_model, generator=generator)}
        return
    from nopelab.training.sources import TextSource

    stream = TextSource(CorpusConfig(source="default", tokenizer="byte"), eval_tokens=0).stream
    for start in range(0, n_train, B):
        yield {"idx": stream.batch("train", min(B, n_train - start), T, generator)[0]}
    held_out = [x for x, _ in stream.eval_windows("val", T, s.test_samples)]
    if len(held_out) < s.test_samples:
        raise UserError(
            f"the corpus's held-out text has {len(held_out)} windows of {T} bytes, fewer than "
            f"the {s.test_samples} test sequences"
        )
    for start in range(0, s.test_samples, B):
        yield {"idx": torch.stack(held_out[start : start + B])}


def norms_by_position(embed: np.ndarray, attn_out: np.ndarray) -> pd.DataFrame:
    """Mean squared norm of the block input and of layer 1's attention output, by position."""
    return pd.DataFrame(
        {
            "position": np.arange(1, embed.shape[1] + 1),
            "input_norm2": _mean_square_norm(embed),
            "attn_out_norm2": _mean_square_norm(attn_out),
        }
    )


def _mean_square_norm(acts: np.ndarray, chunk: int = 64) -> np.ndarray:
    total = np.zeros(acts.shape[1])
    for i in range(0, len(acts), chunk):
        total += np.square(acts[i : i + chunk], dtype=np.float64).sum(-1).sum(0)
    return total / len(acts)


def probe_input(s: Settings, kind: str, folder: Path) -> None:
    """One input kind: collect the activations, fit every probe, write ``probes.parquet`` and
    ``norms.parquet`` into ``folder``.

    Each site and layer's fits are kept as they finish (``fits/SITE-LAYER.parquet``), so a job
    stopped part way collects the activations again but fits only the sites and layers left."""
    fits = folder / "fits"
    fits.mkdir(exist_ok=True)
    probed: list[SiteKey] = [(site, i) for site in SITES for i in s.layers]
    todo = [key for key in probed if not (fits / _fit_name(key)).is_file()]
    norms_file = folder / "norms.parquet"
    if len(todo) < len(probed):
        stage(
            f"probe study, {kind} inputs: {len(probed) - len(todo)} of {len(probed)} sites "
            "and layers fitted before"
        )
    if todo or not norms_file.is_file():
        _fit(s, kind, todo, fits, norms_file)
    probes = pd.concat([pd.read_parquet(fits / _fit_name(key)) for key in probed])
    probes.to_parquet(folder / "probes.parquet", index=False)


def _fit_name(key: SiteKey) -> str:
    return f"{key[0]}-{key[1]}.parquet"


def _fit(s: Settings, kind: str, todo: list[SiteKey], fits: Path, norms_file: Path) -> None:
    """Collect one input kind's activations at the sites and layers of ``todo`` (and those the
    norms need), write the norms, then fit each of ``todo`` and write its rows."""
    device = resolve_device(s.device)
    model = build_model(s.model, s.seed).to(device)  # the same weights for every input
    norm_keys: list[SiteKey] = [("embed", 0), ("attn_out", 1)]
    keys = list(dict.fromkeys(norm_keys + todo))
    n_train, n, T = max(s.samples), s.sequences, s.seq_len
    line = f"probe study, {kind} inputs: collecting {n} sequences of {T}"
    with progress(line, n, label=f"{kind}: collect") as advance:
        acts = collect(model, keys, _batches(s, kind), n, T, s.probe.memory_gb, advance)
    targets = position_targets(n, T, "position")
    test = torch.arange(n_train, n)
    with acts:
        norms = norms_by_position(*(acts.arrays[key] for key in norm_keys))
        replace_atomically(norms_file, partial(norms.to_parquet, index=False))
        for site, layer in todo:
            stage(f"probe study, {kind} inputs: fitting probes at {site} layer {layer}")
            values = torch.from_numpy(np.array(acts.arrays[(site, layer)]))  # into memory
            rows = _fit_site(s, kind, (site, layer), values, targets, test, device)
            replace_atomically(
                fits / _fit_name((site, layer)), partial(rows.to_parquet, index=False)
            )
            del values


def _fit_site(
    s: Settings,
    kind: str,
    key: SiteKey,
    values: torch.Tensor,
    targets: torch.Tensor,
    test: torch.Tensor,
    device: torch.device,
) -> pd.DataFrame:
    """Every feature set, training count and probe at one site and layer: a row each."""
    site, layer = key
    rows: list[dict[str, Any]] = []
    for features in FEATURES:
        X = feature_matrix(values, features)
        for count in s.samples:
            splits = fixed_splits(torch.arange(count), test, s.probe.seeds)
            for probe in PROBES:
                start = time.perf_counter()
                label = f"{features} at {site} layer {layer}"
                results = fit_probe(probe, X, targets, splits, s.probe, s.seed, device, label=label)
                rows.append(
                    {
                        "input": kind,
                        "site": site,
                        "layer": layer,
                        "features": features,
                        "probe": probe,
                        "samples": count,
                        **summarize(results),
                        "seconds": time.perf_counter() - start,
                    }
                )
    return pd.DataFrame(rows)


def run(s: Settings, out: Path) -> None:
    """Both inputs (resumable, one job each), then the tables, figure and summary."""
    jobs = [Job(kind, probe_input, (s, kind)) for kind in INPUTS]
    start = time.perf_counter()
    run_jobs(jobs, out / "inputs", "chi2023 probe study", s.workers, what="inputs")
    seconds = time.perf_counter() - start
    probes = pd.concat(
        [pd.read_parquet(out / "inputs" / k / "probes.parquet") for k in INPUTS], ignore_index=True
    )
    norms = pd.concat(
        pd.read_parquet(out / "inputs" / k / "norms.parquet").assign(input=k) for k in INPUTS
    )
    figures.probe_study(best_rows(probes), INPUT_LABELS, out / "study.png")
    findings = verdicts(probes)
    write_outputs(
        out,
        {"probes": probes, "norms": norms},
        summary_text(s, probes, norms, findings, seconds),
        {"findings": findings, "norms": norm_table(norms, s.seq_len).to_dict("records")},
    )


def best_rows(probes: pd.DataFrame) -> pd.DataFrame:
    """Per input, site, probe, features and count: the layer with the lowest MAE."""
    group = ["input", "site", "probe", "features", "samples"]
    probes = probes.reset_index(drop=True)
    return probes.loc[probes.groupby(group, sort=False)["mae"].idxmin()]


def verdicts(probes: pd.DataFrame) -> list[dict[str, Any]]:
    """Per input and site: does a probe on the raw vector recover position with the most
    training sequences (its best layer's MAE plus its seed std under half the baseline), and
    does the best scalar feature?"""
    largest = probes[probes["samples"] == probes["samples"].max()]
    best = best_rows(largest)
    findings = []
    for (kind, site), rows in best.groupby(["input", "site"], sort=False):
        raw = rows[rows["features"] == "raw"].sort_values("mae").iloc[0]
        scalar = rows[rows["features"] != "raw"].sort_values("mae").iloc[0]
        findings.append(
            {
                "input": kind,
                "site": site,
                "samples": int(raw["samples"]),
                "raw_probe": raw["probe"],
                "raw_layer": int(raw["layer"]),
                "raw_mae": float(raw["mae"]),
                "raw_recovers": bool(raw["mae"] + raw["mae_std"] < raw["baseline"] / 2),
                "scalar_features": scalar["features"],
                "scalar_probe": scalar["probe"],
                "scalar_layer": int(scalar["layer"]),
                "scalar_mae": float(scalar["mae"]),
                "baseline": float(raw["baseline"]),
            }
        )
    return findings


def norm_table(norms: pd.DataFrame, seq_len: int) -> pd.DataFrame:
    """Per input: the input's and layer 1 attention output's squared norm at m = 1, 8, 64, T."""
    positions = [m for m in (1, 8, 64) if m < seq_len] + [seq_len]
    rows = []
    for kind, frame in norms.groupby("input", sort=False):
        frame = frame.set_index("position")
        row: dict[str, Any] = {"input": kind, "input ‖x‖²": float(frame["input_norm2"].mean())}
        for m in positions:
            row[f"‖attn_out‖² at {m}"] = float(frame.loc[m, "attn_out_norm2"])
        rows.append(row)
    return pd.DataFrame(rows)


def layer_table(probes: pd.DataFrame, samples: int) -> pd.DataFrame:
    """Per input, site and layer at ``samples`` training sequences: MAE ± std of every probe and
    feature set, and the baseline."""
    rows = probes[probes["samples"] == samples]
    table = rows[["input", "site", "layer"]].drop_duplicates().set_index(["input", "site", "layer"])
    for (probe, features), cell in rows.groupby(["probe", "features"], sort=False):
        cell = cell.set_index(["input", "site", "layer"]).loc[table.index]
        table[f"{probe} {features}"] = mean_std(cell["mae"], cell["mae_std"])
    table["baseline"] = rows.groupby(["input", "site", "layer"])["baseline"].mean().round(1)
    return table.reset_index()


def samples_table(probes: pd.DataFrame) -> pd.DataFrame:
    """Per input, site and probe, the raw vector's best-layer MAE at every training count."""
    best = best_rows(probes[probes["features"] == "raw"])
    table = best.pivot_table(
        index=["input", "site", "probe"], columns="samples", values="mae", sort=False
    )
    table.columns = [f"{c} sequences" for c in table.columns]
    return table.round(1).reset_index()


def summary_text(
    s: Settings,
    probes: pd.DataFrame,
    norms: pd.DataFrame,
    findings: list[dict[str, Any]],
    seconds: float,
) -> str:
    p = s.probe
    return fill(
        "chi2023.probe_study",
        **shape_values(s.model),
        init_std=SIGMA,
        seq_len=s.seq_len,
        samples=", ".join(map(str, s.samples)),
        test_samples=s.test_samples,
        layers=", ".join(map(str, s.layers)),
        probe_hidden=p.hidden,
        probe_epochs=p.epochs,
        probe_seeds=p.seeds,
        baseline=f"{s.seq_len / 4:g}",
        seed=s.seed,
        seconds=f"{seconds:.0f}",
        findings=findings,
        inputs=INPUT_LABELS,
        norm_table=markdown_table(norm_table(norms, s.seq_len)),
        samples_table=markdown_table(samples_table(probes)),
        largest=max(s.samples),
        layer_table=markdown_table(layer_table(probes, max(s.samples))),
    )
