"""Zuo et al. 2025, probes: does variance or cosine similarity carry position better?

Following Zuo et al., MLP probes (d → 64 → ReLU → 1, MSE) read position from the attention
heads of a causal NoPE model, at their site (``attn_heads``: heads concatenated, before the
output projection) and after the projection (``attn_out``), each probe seeing one feature set: the raw vector, its norm, its variance over
coordinates (Chi et al.'s signal), its cosine similarity to the last token, its sorted cosine
row (Zuo et al.'s signal), and norm + cosine-to-last together. Targets: absolute position and
distance to the last token. Inputs are sequences of uniformly random digits: the probes train
on sequences drawn from one half of the ten digits and are tested on sequences from the other
half (Zuo et al. train on 5-8 and test on 1-4), of Zuo et al.'s length 16. Digits, because a task model has only learned
embeddings for the characters its task uses; most of the 96-character vocabulary never occurs
in training, and such tokens all collapse to nearly the same vector. Probed models: the random-init model and the NoPE
model trained on each task (``add``, ``reverse``, ``order``, ``wherex``; the same training
as ``zuo2025 --part trained``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nopelab import plots
from nopelab.config import AnalysisConfig, ProbeConfig, Site, Target
from nopelab.errors import UserError
from nopelab.experiments.outputs import gather, write_outputs
from nopelab.experiments.scale_files import read_scales, scale_schema
from nopelab.experiments.summary_template import fill, shape_values
from nopelab.experiments.train_and_measure import train_into, training_job
from nopelab.experiments.zuo2025 import trained as zuo2025_trained
from nopelab.models.transformer import Transformer, build_model
from nopelab.probing import signals
from nopelab.probing.pipeline import probe_model, vocab_halves
from nopelab.runtime.device import resolve_device
from nopelab.runtime.jobs import Job, is_done, run_jobs
from nopelab.runtime.rundir import write_json
from nopelab.tables import by_layer, markdown_table, mean_std
from nopelab.training import tasks
from nopelab.training.run import TrainRun, read_run
from nopelab.training.task_config import Layout
from nopelab.training.task_kinds import DIGITS
from nopelab.training.trained import load_trained

FEATURES = ("raw", "norm", "variance", "cos_last", "cos_row", "norm+cos_last")
TARGETS: tuple[Target, ...] = ("position", "distance")
SITES: tuple[Site, ...] = ("attn_heads", "attn_out")
SEQ_LEN = 16  # Zuo et al.'s probe sequences
RANDOM = "random-init"


@scale_schema
class ProbeScale:
    samples: int  # probe inputs per model and target: sequences of uniformly random digits
    epochs: int


SCALES = read_scales("zuo2025.probes", ProbeScale)


@dataclass(frozen=True)
class Settings:
    runs: dict[str, TrainRun]  # task -> NoPE training run
    stages: dict[str, tuple[TrainRun, ...]]  # task -> its curriculum's earlier stages
    analysis: AnalysisConfig
    workers: int  # models trained and probed at once (one-thread worker processes)
    probes: dict[Target, ProbeConfig]  # target -> probe settings
    models: Path | None = None  # a finished `--part trained` run whose NoPE models to reuse


def reuse_models(settings: Settings, models: Path) -> Settings:
    """The same settings, taking the NoPE models from ``models`` (a finished ``zuo2025 --part
    trained`` run) instead of training them again: each must be there, finished, and trained
    with exactly the settings this part would use (same scale, seed and device)."""
    for task, run in settings.runs.items():
        folder = models / "runs" / f"{task}-none"
        if not is_done(models / "runs", folder.name):
            raise UserError(
                f"--models: {folder} holds no finished model; give the folder of a finished "
                "`nopelab reproduce zuo2025 --part trained` run"
            )
        stored = read_run(folder)  # init_from names where its curriculum's last stage trained
        stored = dataclasses.replace(
            stored, train=dataclasses.replace(stored.train, init_from=None)
        )
        if stored != run:
            raise UserError(
                f"--models: {folder} was trained with other settings; use a `--part trained` "
                "run of the same --scale, --seed and --device"
            )
    return dataclasses.replace(settings, models=models.absolute())


def settings(scale: str, seed: int, device: str, layout: Layout | None = None) -> Settings:
    trained = zuo2025_trained.settings(scale, seed, device, layout)
    resolve_device(device)
    runs = {task: run for (task, pe), run in trained.runs.items() if pe == "none"}
    stages = {task: trained.stages[task, "none"] for task in runs}
    p = SCALES[scale]
    analysis = AnalysisConfig(
        seq_len=SEQ_LEN,
        samples=p.samples,
        batch_size=min(p.samples, 32),
        input="tokens",
        sites=SITES,
        seed=seed,
        device=device,
    )
    probes = {
        target: ProbeConfig(
            probes=("mlp-reg",),
            features=FEATURES,
            target=target,
            split="vocab",
            seeds=3,
            hidden=64,
            epochs=p.epochs,
            batch_size=128,
        )
        for target in TARGETS
    }
    return Settings(runs, stages, analysis, trained.workers, probes)


def restrict_vocab(model: Transformer, ids: list[int]) -> Transformer:
    """The same model over the tokens ``ids`` only (token i of the new model is ``ids[i]``):
    every weight is shared except the embedding, which keeps just those rows. Its activations on
    a sequence are the original model's on the mapped sequence; the vocabulary split of
    :func:`~nopelab.probing.pipeline.probe_model` then splits ``ids``."""
    cfg = dataclasses.replace(model.cfg, vocab_size=len(ids))
    state = dict(model.state_dict())
    for name in ("embed.weight", "lm_head.weight"):  # the same tensor when tied
        state[name] = state[name][ids]
    restricted = Transformer(cfg)
    restricted.load_state_dict(state)
    return restricted.eval()


DIGIT_IDS = tasks.encode(DIGITS)


def _probe(model: Transformer, settings: Settings, label: str, state: str) -> list[dict]:
    model = restrict_vocab(model, DIGIT_IDS)
    rows = []
    for target, probe in settings.probes.items():
        rows += probe_model(
            model,
            settings.analysis,
            probe,
            description=f"{label} {target}",
            labels={"model": label, "state": state},
        )
    return rows


def verdict_table(probes: pd.DataFrame) -> pd.DataFrame:
    """Per target, model and layer: each signal's best MAE, the winner and whether it is
    decisive (ahead of the runner-up by more than the sum of their seed stds)."""
    frames = []
    for target in TARGETS:
        rows = probes[probes["target"] == target].to_dict(orient="records")
        if rows:
            frames.append(signals.verdict(rows).assign(target=target))
    table = pd.concat(frames, ignore_index=True)
    first = ["target", "model", "site", "layer"]
    return table[first + [c for c in table.columns if c not in (*first, "state", "site")]]


def probe_table(probes: pd.DataFrame, target: str) -> pd.DataFrame:
    """Rows (model, site, features), columns per layer: MAE ± std (Pearson r), the baseline."""
    rows = probes[probes["target"] == target]
    models = list(dict.fromkeys(rows["model"]))
    index = ["model", "site", "features"]
    cells = mean_std(rows["mae"], rows["mae_std"], rows["r"])
    table = by_layer(rows, index, cells, pd.MultiIndex.from_product([models, SITES, FEATURES]))
    table["baseline"] = rows.groupby(index)["baseline"].mean().round(2)
    return table.reset_index()


def _readable_verdict(table: pd.DataFrame) -> pd.DataFrame:
    def entry(row: pd.Series) -> str:
        mark = "" if row["decisive"] else " (not decisive)"
        return f"{row['winner']}{mark}"

    frame = table.assign(cell=table.apply(entry, axis=1))
    out = frame.pivot(index=["target", "model", "site"], columns="layer", values="cell")
    out.columns = [f"L{c}" for c in out.columns]
    models = list(dict.fromkeys(table["model"]))
    return (
        out.reindex(pd.MultiIndex.from_product([TARGETS, models, SITES]))
        .rename_axis(["target", "model", "site"])
        .reset_index()
    )


def tally(table: pd.DataFrame) -> dict[str, dict[str, int]]:
    """How often each signal wins, decisively and in all, over (target, model, layer)."""
    return {
        signal: {
            "decisive": int(((table["winner"] == signal) & table["decisive"]).sum()),
            "all": int((table["winner"] == signal).sum()),
        }
        for signal in signals.SIGNALS
    }


def position_wins(table: pd.DataFrame) -> dict[tuple[str, str], list[str]]:
    """Per (model, site), the winner at each layer for the position target: ``L2 similarity``,
    with ``?`` where the win is within the seed spread."""
    position = table[table["target"] == "position"]
    return {
        (str(model), str(site)): [
            f"L{row.layer} {row.winner}{'' if row.decisive else '?'}" for row in group.itertuples()
        ]
        for (model, site), group in position.groupby(["model", "site"], sort=False)
    }


def _reused(settings: Settings) -> str:
    if settings.models is None:
        return ""
    return f" The models were taken from `{settings.models}` (`--models`), not trained again."


def probe_random_init(run: TrainRun, settings: Settings, folder: Path) -> None:
    """Probe the model every task model starts from (same config, same seed). A job."""
    rows = _probe(build_model(run.model, run.train.seed), settings, RANDOM, "init")
    write_json(folder / "probes.json", {"rows": rows})


def train_and_probe(task: str, run: TrainRun, settings: Settings, folder: Path) -> None:
    """Train one task's NoPE model into ``folder`` (or take it from ``settings.models``), then
    probe it (``probes.json``). A job."""
    if settings.models is None:
        train_into(run, folder, settings.stages[task])
    model = load_trained(_model_folder(settings, folder))[1]
    write_json(folder / "probes.json", {"rows": _probe(model, settings, task, "trained")})


def _model_folder(settings: Settings, folder: Path) -> Path:
    return folder if settings.models is None else settings.models / "runs" / folder.name


def run(settings: Settings, out: Path) -> None:
    first = next(iter(settings.runs.values()))
    names = {task: f"{task}-none" for task in settings.runs}
    jobs = [Job(RANDOM, probe_random_init, (first, settings))] + [
        training_job(
            names[task], train_and_probe, (task, run, settings), run, settings.stages[task]
        )
        for task, run in settings.runs.items()
    ]
    run_jobs(jobs, out / "runs", "zuo2025 probed models", settings.workers, what="models")
    rows = gather(out, [(name, {}) for name in (RANDOM, *names.values())], "probes.json", "rows")
    accuracy = []
    for task, name in names.items():
        summary = _model_folder(settings, out / "runs" / name) / "summary.json"
        accuracy.append(
            {"task": task, "accuracy": json.loads(summary.read_text())["final_eval"]["accuracy"]}
        )

    probes = pd.DataFrame(rows)
    verdict = verdict_table(probes)
    plots.probe_errors(
        probes.assign(panel=probes["model"] + ", " + probes["site"] + ", " + probes["target"]),
        out / "probes.png",
        panel="panel",
        line="features",
        title="Zuo et al. 2025: position probes at attn_heads and attn_out (held-out tokens)",
    )
    write_outputs(
        out,
        {"probes": probes, "verdict": verdict},
        summary_text(settings, accuracy, probes, verdict),
        {
            "accuracy": accuracy,
            "rows": rows,
            "verdict": verdict.to_dict(orient="records"),
            "tally": tally(verdict),
        },
    )


def summary_text(
    settings: Settings, accuracy: list[dict], probes: pd.DataFrame, verdict: pd.DataFrame
) -> str:
    """``summary.md``: the probe protocol, the verdict, and the MAE tables per target."""
    first = next(iter(settings.runs.values()))
    m, t, a = first.model, first.train, settings.analysis
    p = settings.probes["position"]
    train_ids, test_ids = vocab_halves(len(DIGIT_IDS), a.seed)
    halves = (
        f"train on {''.join(DIGITS[i] for i in train_ids)}, "
        f"test on {''.join(DIGITS[i] for i in test_ids)}"
    )
    return fill(
        "zuo2025.probes",
        **shape_values(m),
        random=RANDOM,
        seed=t.seed,
        hidden=p.hidden,
        lr=f"{p.lr:g}",
        batch_size=p.batch_size,
        epochs=p.epochs,
        samples=a.samples,
        seq_len=a.seq_len,
        test_share=f"{p.test_fraction:.0%}",
        halves=halves,
        probe_seeds=p.seeds,
        baseline=f"{a.seq_len / 4:g}",
        accuracies=", ".join(f"{row['task']} {row['accuracy']:.3f}" for row in accuracy),
        reused=_reused(settings),
        cells=len(verdict),
        tally=tally(verdict),
        position_wins=position_wins(verdict),
        verdict_table=markdown_table(_readable_verdict(verdict)),
        position_table=markdown_table(probe_table(probes, "position")),
        distance_table=markdown_table(probe_table(probes, "distance")),
    )
