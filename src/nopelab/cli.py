"""The ``nopelab`` command line: ``analyze`` a model, ``reproduce`` a paper's results."""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nopelab.allocator import keep_freed_memory
from nopelab.errors import RunFailed, UserError
from nopelab.rundir import is_disk_full

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure where transformers without positional encodings keep position.",
)

MODEL = "Model"
ANALYSIS = "Analysis"
DATA = "Data"
TRAINING = "Training"
OUTPUT = "Output"
PROBE = "Probe"


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise UserError(
            f"{flag}: expected comma-separated layer numbers like 2,4, got {text!r}"
        ) from None


def _words(text: str | None) -> tuple[str, ...] | None:
    return (
        None if text is None else tuple(part for part in text.replace(" ", "").split(",") if part)
    )


# Options shared by ``analyze`` and ``train``: None means "not given" (the default applies).
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="TOML, YAML or JSON file with settings tables; flags override it.",
        rich_help_panel=OUTPUT,
    ),
]
PosEncoding = Annotated[
    str | None,
    typer.Option(help="none | learned | sinusoidal | rope | alibi", rich_help_panel=MODEL),
]
NopeLayers = Annotated[
    str | None,
    typer.Option(help="1-based layers without rope/alibi, e.g. 2,4", rich_help_panel=MODEL),
]
Layers = Annotated[int | None, typer.Option(help="Number of blocks [6]", rich_help_panel=MODEL)]
Heads = Annotated[int | None, typer.Option(help="Attention heads [6]", rich_help_panel=MODEL)]
DModel = Annotated[int | None, typer.Option(help="Hidden size [384]", rich_help_panel=MODEL)]
VocabSize = Annotated[
    int | None,
    typer.Option(help="Vocabulary size [96; set by the data when training]", rich_help_panel=MODEL),
]
MaxSeqLen = Annotated[
    int | None, typer.Option(help="Learned position table size [256]", rich_help_panel=MODEL)
]
Bidirectional = Annotated[
    bool | None,
    typer.Option(
        "--bidirectional/--causal", help="Attention mask \\[causal]", rich_help_panel=MODEL
    ),
]
Norm = Annotated[str | None, typer.Option(help="layernorm | rmsnorm", rich_help_panel=MODEL)]
NormPosition = Annotated[str | None, typer.Option(help="pre | post", rich_help_panel=MODEL)]
Bias = Annotated[
    bool | None,
    typer.Option(
        "--bias/--no-bias", help="Biases in linear layers and norms \\[no]", rich_help_panel=MODEL
    ),
]
Init = Annotated[
    str | None,
    typer.Option(
        help="normal | gpt2 | xavier_normal | xavier_uniform | kaiming_uniform | uniform | pytorch",
        rich_help_panel=MODEL,
    ),
]
InitStd = Annotated[
    float | None,
    typer.Option(
        help="σ of normal/gpt2 init, half-width a of uniform [0.02]", rich_help_panel=MODEL
    ),
]
Dropout = Annotated[
    float | None, typer.Option(help="Dropout probability [0]", rich_help_panel=MODEL)
]
Mlp = Annotated[
    str | None,
    typer.Option(help="gelu | swiglu (Llama-style gated) \\[gelu]", rich_help_panel=MODEL),
]
Out = Annotated[
    Path | None, typer.Option(help="Run directory \\[runs/NAME-TIMESTAMP]", rich_help_panel=OUTPUT)
]
Force = Annotated[bool, typer.Option(help="Replace a non-empty --out", rich_help_panel=OUTPUT)]

SeqLen = Annotated[int | None, typer.Option(help="Sequence length [256]", rich_help_panel=ANALYSIS)]
Samples = Annotated[
    int | None, typer.Option(help="Number of sequences [64]", rich_help_panel=ANALYSIS)
]
BatchSize = Annotated[
    int | None, typer.Option(help="Sequences per forward pass [8]", rich_help_panel=ANALYSIS)
]
Input = Annotated[
    str | None,
    typer.Option(
        help="random (N(0,1) vectors) | tokens (uniform ids) | data (a run's held-out task "
        "lines or text) | prompts (a task run's test prompts, one per sequence, left-padded "
        "with newlines to --seq-len, as Zuo et al.) \\[random; data for a run directory]",
        rich_help_panel=ANALYSIS,
    ),
]
Sites = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated: embed,attn_heads,attn_out,resid_mid,mlp_out,resid_post "
        "\\[all but attn_heads]",
        rich_help_panel=ANALYSIS,
    ),
]
AttnEntropy = Annotated[
    bool | None,
    typer.Option(
        "--attn-entropy/--no-attn-entropy",
        help="Also record attention entropy and logit spread \\[no]",
        rich_help_panel=ANALYSIS,
    ),
]
Dtype = Annotated[
    str | None, typer.Option(help="float32 | bfloat16 | float16", rich_help_panel=ANALYSIS)
]
Seed = Annotated[
    int | None, typer.Option(help="Seed for weights and inputs [0]", rich_help_panel=ANALYSIS)
]
Device = Annotated[
    str | None, typer.Option(help="auto | cpu | cuda[:N] \\[auto]", rich_help_panel=ANALYSIS)
]

HF = "Hugging Face model (hf:PATH)"
Text = Annotated[
    str | None,
    typer.Option(
        help="Text for an hf: model with --input data: default (the corpus's held-out tail) or a "
        "text file or folder \\[default]",
        rich_help_panel=HF,
    ),
]
MaxLayers = Annotated[
    int | None,
    typer.Option(
        help="Analyse only the first N layers of an hf: model \\[all]", rich_help_panel=HF
    ),
]
TrustRemoteCode = Annotated[
    bool,
    typer.Option(
        help="Let an hf: model folder run its own Python code (auto_map); only for models you trust",
        rich_help_panel=HF,
    ),
]
RopeOff = Annotated[
    str | None,
    typer.Option(
        help="Switch RoPE off in these layers of an hf: model, e.g. 4,8,12, or all \\[none]",
        rich_help_panel=HF,
    ),
]
HF_FLAGS = ("text", "max_layers", "trust_remote_code", "rope_off")

ProbeLayers = Annotated[
    str | None,
    typer.Option(help="Layers to probe, e.g. 0,3,6 (embed is 0) \\[all]", rich_help_panel=PROBE),
]
Probes = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated: linear-cls,mlp-cls,linear-reg,mlp-reg", rich_help_panel=PROBE
    ),
]
Features = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated feature sets from raw, norm, variance, cos_last, cos_row; "
        "join with + to combine, e.g. raw,norm+cos_last",
        rich_help_panel=PROBE,
    ),
]
Target = Annotated[
    str | None,
    typer.Option(
        help="position | distance (to the last token) \\[position]", rich_help_panel=PROBE
    ),
]
Split = Annotated[
    str | None,
    typer.Option(
        help="sequences (held-out sequences) | vocab (train and test sequences from disjoint "
        "halves of the vocabulary; needs --input tokens) \\[sequences]",
        rich_help_panel=PROBE,
    ),
]
ProbeSeeds = Annotated[
    int | None,
    typer.Option(
        help="Probe repeats (split and initialisation) for mean ± std [3]", rich_help_panel=PROBE
    ),
]
Epochs = Annotated[
    int | None, typer.Option(help="MLP/linear-cls epochs [20]", rich_help_panel=PROBE)
]
Hidden = Annotated[int | None, typer.Option(help="MLP hidden width [64]", rich_help_panel=PROBE)]

PROBE_FLAGS = (
    "probe_layers",
    "probes",
    "features",
    "target",
    "split",
    "probe_seeds",
    "epochs",
    "hidden",
)


def _probe_flags(arguments: dict[str, Any]) -> dict[str, Any]:
    """The probe flags among a command's ``arguments``, under their config names."""
    flags = {name: arguments[name] for name in PROBE_FLAGS}
    flags["layers"] = _ints(flags.pop("probe_layers"), "--probe-layers")
    flags["seeds"] = flags.pop("probe_seeds")
    flags["probes"], flags["features"] = _words(flags["probes"]), _words(flags["features"])
    return flags


MODEL_FLAGS = (
    "pos_encoding", "nope_layers", "layers", "heads", "d_model", "vocab_size", "max_seq_len",
    "bidirectional", "norm", "norm_position", "bias", "init", "init_std", "dropout", "mlp",
)  # fmt: skip


def _model_flags(arguments: dict[str, Any]) -> dict[str, Any]:
    """The model flags among a command's ``arguments``, under their config names."""
    flags = {name: arguments[name] for name in MODEL_FLAGS if name in arguments}
    flags["nope_layers"] = _ints(flags["nope_layers"], "--nope-layers")
    flags["n_layers"], flags["n_heads"] = flags.pop("layers"), flags.pop("heads")
    return flags


ANALYSIS_FLAGS = (
    "seq_len", "samples", "batch_size", "input", "sites", "attn_entropy", "dtype", "seed", "device",
)  # fmt: skip


def _analysis_flags(arguments: dict[str, Any]) -> dict[str, Any]:
    """The analysis flags among a command's ``arguments``."""
    flags = {name: arguments[name] for name in ANALYSIS_FLAGS if name in arguments}
    flags["sites"] = _words(flags["sites"])
    return flags


def _merge(data: dict[str, Any], section: str, flags: dict[str, Any]) -> None:
    """Lay the given flags over ``data[section]`` (from a config file)."""
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        raise UserError(f"--config: [{section}] must be a table of settings")
    table.update({k: v for k, v in flags.items() if v is not None})


def _layers_or_all(text: str | None, flag: str) -> tuple[int, ...] | str | None:
    return "all" if text == "all" else _ints(text, flag)


def _hf_path(run_dir: Path | None) -> str | None:
    """``PATH`` of an ``hf:PATH`` argument, else ``None``."""
    return str(run_dir)[3:] if run_dir is not None and str(run_dir).startswith("hf:") else None


def _inputs(*run_dirs: Path | None) -> list[Path]:
    """The folders or files a command reads (``hf:PATH`` gives ``PATH``): never an output."""
    return [Path(_hf_path(r) or r) for r in run_dirs if r is not None]


def _model_and_analysis(
    run_dir: Path | None,
    data: dict[str, Any],
    model_flags: dict[str, Any],
    analysis_flags: dict[str, Any],
    analysis_defaults: dict[str, Any] | None = None,
    sections: tuple[str, ...] = ("model", "analysis"),
    hf_flags: dict[str, Any] | None = None,
    statistics: bool = True,
) -> tuple[Any, Any, Any]:
    """The model to study and the validated [model]+[analysis] settings: a training run's
    checkpoint (default input: its held-out data), a Hugging Face model (``hf:PATH``; default
    input: text) or a random-init model built from the flags.

    Returns ``(config, model, source)``: a RunConfig (an HFRun for hf:), the model, and the data
    source when input is ``data``. ``data`` (from a config file) may hold the other ``sections``;
    they are left for the caller. ``statistics``: whether the T x T statistics will be
    reduced (analyze), for the memory check.
    """
    from nopelab.api import load
    from nopelab.errors import ConfigError

    unknown = set(data) - set(sections)
    if unknown:
        allowed = ", ".join(sections)
        raise ConfigError("config", f"unknown section {sorted(unknown)[0]!r}; allowed: {allowed}")

    section = data.get("analysis", {})
    if isinstance(section, dict):
        for key, value in (analysis_defaults or {}).items():
            section.setdefault(key, value)
        data["analysis"] = section
    settings = {key: data[key] for key in ("model", "analysis") if key in data}
    hf_flags = hf_flags or {}
    hf_path = _hf_path(run_dir)
    if hf_path is None:
        given = [k for k, v in hf_flags.items() if v not in (None, False)]
        if given:
            raise UserError(f"--{given[0].replace('_', '-')}: only applies to an hf:PATH model")
    if run_dir is not None:
        given = [
            f"--{RENAMED.get(k, k).replace('_', '-')}"
            for k, v in model_flags.items()
            if v is not None
        ]
        if given or "model" in settings:
            raise UserError(
                f"{given[0] if given else '--config'}: a trained or Hugging Face model fixes the "
                "model; drop the model settings"
            )
    _merge(settings, "analysis", analysis_flags)
    if run_dir is None:
        _merge(settings, "model", model_flags)
    study = load(
        run_dir,
        model=settings.get("model"),
        analysis=settings["analysis"],
        text=hf_flags.get("text") or "default",
        max_layers=hf_flags.get("max_layers"),
        trust_remote_code=bool(hf_flags.get("trust_remote_code")),
        rope_off=_layers_or_all(hf_flags.get("rope_off"), "--rope-off"),
        statistics=statistics,
    )
    return study.config, study.model, study.source


@app.command()
def analyze(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            help="A training run directory: analyse its trained model (default input: its own "
            "held-out data); or hf:PATH, a Hugging Face model folder or .gguf file (default "
            "input: text). Without it, a randomly initialised model is built from the flags."
        ),
    ] = None,
    config: ConfigFile = None,
    pos_encoding: PosEncoding = None,
    nope_layers: NopeLayers = None,
    layers: Layers = None,
    heads: Heads = None,
    d_model: DModel = None,
    vocab_size: VocabSize = None,
    max_seq_len: MaxSeqLen = None,
    bidirectional: Bidirectional = None,
    norm: Norm = None,
    norm_position: NormPosition = None,
    bias: Bias = None,
    init: Init = None,
    init_std: InitStd = None,
    mlp: Mlp = None,
    seq_len: SeqLen = None,
    samples: Samples = None,
    batch_size: BatchSize = None,
    input: Input = None,
    sites: Sites = None,
    attn_entropy: AttnEntropy = None,
    dtype: Dtype = None,
    seed: Seed = None,
    device: Device = None,
    text: Text = None,
    max_layers: MaxLayers = None,
    trust_remote_code: TrustRemoteCode = False,
    rope_off: RopeOff = None,
    out: Out = None,
    force: Force = False,
) -> None:
    """Analyse a model: variance, norms, cosine similarity, adjacency scores per layer and site.

    Random-init by default; give a training run directory to analyse its trained checkpoint, or
    hf:PATH for a Hugging Face model.
    """
    arguments = dict(locals())  # the flags as given, before any other name exists
    from nopelab.analysis import analyze_model
    from nopelab.config import read_config_file
    from nopelab.report import write_analysis
    from nopelab.rundir import check_out, default_out, staged_run
    from nopelab.runtime import resolve_device

    data: dict[str, Any] = read_config_file(config) if config else {}
    model_flags = _model_flags(arguments)
    analysis_flags = _analysis_flags(arguments)
    hf_flags = {name: arguments[name] for name in HF_FLAGS}
    out = out or default_out(f"analyze-{Path(str(run_dir)).name}" if run_dir else "analyze")
    check_out(out, force, _inputs(run_dir))
    cfg, model, source = _model_and_analysis(
        run_dir, data, model_flags, analysis_flags, hf_flags=hf_flags
    )
    resolve_device(cfg.analysis.device)
    with staged_run(out, force, _inputs(run_dir), command="analyze") as staging:
        start = time.perf_counter()
        result = analyze_model(model, cfg.analysis, source=source)
        title = _title(run_dir)
        seconds = time.perf_counter() - start
        write_analysis(staging, cfg, result, seconds, title=title, random_init=run_dir is None)
        if _hf_path(run_dir):
            from nopelab.hf.positions import position_use, write_position_use

            write_position_use(staging, position_use(model, seed=cfg.analysis.seed))
    typer.echo(f"wrote {out}")


@app.command()
def train(
    task: Annotated[
        str | None,
        typer.Option(help="add | reverse | order | wherex | copy | count", rich_help_panel=DATA),
    ] = None,
    task_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="zuo ($50+148=891$, Zuo et al.'s data files) | plain (123+45=168; copy, count) "
            "\\[zuo where the task has it]",
            rich_help_panel=DATA,
        ),
    ] = None,
    layout: Annotated[
        str | None,
        typer.Option(
            help="packed (lines end to end) | windows (random windows of the concatenated lines, "
            "as Zuo et al.) | padded (one line per row, prompt left-padded) \\[packed]",
            rich_help_panel=DATA,
        ),
    ] = None,
    loss_mode: Annotated[
        str | None,
        typer.Option(
            help="answer (loss on answers only) | all (every character, as Zuo et al.) \\[answer]",
            rich_help_panel=DATA,
        ),
    ] = None,
    min_len: Annotated[
        int | None,
        typer.Option(help="Shortest training operand \\[task default]", rich_help_panel=DATA),
    ] = None,
    max_len: Annotated[
        int | None,
        typer.Option(help="Longest training operand \\[task default]", rich_help_panel=DATA),
    ] = None,
    test_min_len: Annotated[
        int | None, typer.Option(help="Shortest test operand [= --min-len]", rich_help_panel=DATA)
    ] = None,
    test_max_len: Annotated[
        int | None, typer.Option(help="Longest test operand [= --max-len]", rich_help_panel=DATA)
    ] = None,
    reversed_answer: Annotated[
        bool | None,
        typer.Option(
            "--reversed-answer/--plain-answer",
            help="add: sum written backwards \\[plain]",
            rich_help_panel=DATA,
        ),
    ] = None,
    train_size: Annotated[
        int | None, typer.Option(help="Training lines [10000]", rich_help_panel=DATA)
    ] = None,
    test_size: Annotated[
        int | None, typer.Option(help="Test lines [1000]", rich_help_panel=DATA)
    ] = None,
    corpus: Annotated[
        str | None,
        typer.Option(
            help="default (World English Bible) | a .txt file | a folder of .txt | .jsonl | .parquet | hf:NAME[:SPLIT]",
            rich_help_panel=DATA,
        ),
    ] = None,
    column: Annotated[
        str | None,
        typer.Option(help="Text column of .jsonl/.parquet/hf \\[text]", rich_help_panel=DATA),
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="byte | bpe \\[byte]", rich_help_panel=DATA)
    ] = None,
    bpe_vocab: Annotated[
        int | None, typer.Option(help="BPE vocabulary size [4096]", rich_help_panel=DATA)
    ] = None,
    config: ConfigFile = None,
    pos_encoding: PosEncoding = None,
    nope_layers: NopeLayers = None,
    layers: Layers = None,
    heads: Heads = None,
    d_model: DModel = None,
    vocab_size: VocabSize = None,
    max_seq_len: MaxSeqLen = None,
    bidirectional: Bidirectional = None,
    norm: Norm = None,
    norm_position: NormPosition = None,
    bias: Bias = None,
    init: Init = None,
    init_std: InitStd = None,
    mlp: Mlp = None,
    dropout: Dropout = None,
    steps: Annotated[
        int | None, typer.Option(help="Optimiser steps [2000]", rich_help_panel=TRAINING)
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Global batch in sequences [32]", rich_help_panel=TRAINING)
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            help="Training context [256; --layout padded: the task's longest line]",
            rich_help_panel=TRAINING,
        ),
    ] = None,
    lr: Annotated[
        float | None, typer.Option(help="Peak learning rate [1e-3]", rich_help_panel=TRAINING)
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Warm-up steps [100]", rich_help_panel=TRAINING)
    ] = None,
    weight_decay: Annotated[
        float | None, typer.Option(help="AdamW weight decay [0.1]", rich_help_panel=TRAINING)
    ] = None,
    grad_clip: Annotated[
        float | None,
        typer.Option(help="Gradient-norm clip, 0 = off [1.0]", rich_help_panel=TRAINING),
    ] = None,
    eval_every: Annotated[
        int | None, typer.Option(help="Steps between evaluations [250]", rich_help_panel=TRAINING)
    ] = None,
    checkpoint_every: Annotated[
        int | None, typer.Option(help="Steps between checkpoints [250]", rich_help_panel=TRAINING)
    ] = None,
    compile: Annotated[
        bool | None,
        typer.Option(
            "--compile/--no-compile",
            help="torch.compile the model \\[no]",
            rich_help_panel=TRAINING,
        ),
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            help="auto (bf16 autocast on CUDA) | float32 | bfloat16", rich_help_panel=TRAINING
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed for data, weights and dropout [0]", rich_help_panel=TRAINING),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="auto | cpu | cuda[:N] \\[auto]", rich_help_panel=TRAINING)
    ] = None,
    out: Out = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue the run in --out from its checkpoint", rich_help_panel=OUTPUT),
    ] = False,
    tensorboard: Annotated[
        bool,
        typer.Option(
            help="Also log to --out/tensorboard (needs the tensorboard package)",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    force: Force = False,
) -> None:
    """Train a model on a synthetic task (--task) or on text (--corpus); torchrun runs it data-parallel."""
    arguments = dict(locals())  # the flags as given, before any other name exists
    from nopelab.config import read_config_file
    from nopelab.tasks import VOCAB
    from nopelab.train import TrainRun, read_run
    from nopelab.train import train as run_training

    if resume and force:
        raise UserError("--resume and --force exclude each other")
    if resume and out is None:
        raise UserError("--resume: give the run directory with --out")
    if resume:
        if not (out / "config.json").is_file():
            raise UserError(f"--resume: {out} holds no training run (no config.json)")
        data: dict[str, Any] = read_run(out).to_dict()
    else:
        data = read_config_file(config) if config else {}
    if task is not None:
        data.setdefault("task", {})["name"] = task
    if corpus is not None:
        data.setdefault("corpus", {})["source"] = corpus
    if not resume and "task" not in data and "corpus" not in data:
        raise UserError(
            "--task or --corpus: say what to train on (e.g. --task add or --corpus default)"
        )
    if "task" in data:
        _merge(
            data,
            "task",
            {
                "format": task_format,
                "layout": layout,
                "loss_mode": loss_mode,
                "min_len": min_len,
                "max_len": max_len,
                "test_min_len": test_min_len,
                "test_max_len": test_max_len,
                "reversed_answer": reversed_answer,
                "train_size": train_size,
                "test_size": test_size,
            },
        )
    if "corpus" in data:
        _merge(data, "corpus", {"column": column, "tokenizer": tokenizer, "bpe_vocab": bpe_vocab})
    model_flags = _model_flags(arguments)
    if not resume and vocab_size is None and "vocab_size" not in data.get("model", {}):
        model_flags["vocab_size"] = len(VOCAB) if "task" in data else _corpus_vocab(data["corpus"])
    _merge(data, "model", model_flags)
    padded = isinstance(data.get("task"), dict) and data["task"].get("layout") == "padded"
    if not resume and padded and seq_len is None and "seq_len" not in data.get("train", {}):
        from nopelab.config import build
        from nopelab.tasks import TaskConfig, max_line_len

        # one line per row: a longer context would only add padding
        seq_len = max_line_len(build(TaskConfig, data["task"], "config.task"))
    _merge(
        data,
        "train",
        {
            "steps": steps,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "lr": lr,
            "warmup": warmup,
            "weight_decay": weight_decay,
            "grad_clip": grad_clip,
            "eval_every": eval_every,
            "checkpoint_every": checkpoint_every,
            "compile": compile,
            "precision": precision,
            "seed": seed,
            "device": device,
        },
    )
    run = TrainRun.from_dict(data)
    out = out or default_out_for_train(run)
    try:
        summary = run_training(run, out, resume=resume, force=force, tensorboard=tensorboard)
    except KeyboardInterrupt:
        typer.echo(f"nopelab: interrupted; {_kept_checkpoint(out)}", err=True)
        sys.exit(130)
    except RunFailed as exc:
        typer.echo(f"nopelab: error: {exc}; {_kept_checkpoint(out, hint=False)}", err=True)
        sys.exit(1)
    if summary is not None and int(os.environ.get("RANK", "0")) == 0:
        typer.echo(
            f"final evaluation: {_format_metrics(summary['final_eval'])}; "
            f"{summary['tokens_per_second']:.0f} tokens/s"
        )
        typer.echo(f"wrote {out}")


def _kept_checkpoint(out: Path, hint: bool = True) -> str:
    """What a stopped training run kept, and (``hint``) how to continue it."""
    from nopelab.checkpoint import STATE_FILE, read_state

    if not (out / STATE_FILE).is_file():
        return "no checkpoint yet: nothing was kept"
    kept = f"the checkpoint of step {read_state(out)['step']} is kept"
    if not hint:
        return kept
    return (
        f"{kept}: continue with {shlex.join(['nopelab', 'train', '--resume', '--out', str(out)])}"
    )


def _corpus_vocab(corpus: dict[str, Any]) -> int:
    """The model vocabulary a corpus setting implies (byte: 256; bpe: its vocabulary size)."""
    if corpus.get("tokenizer", "byte") == "bpe":
        return int(corpus.get("bpe_vocab", 4096))
    return 256


def default_out_for_train(run: Any) -> Path:
    from nopelab.rundir import default_out

    what = run.task.name if run.task is not None else "text"
    return default_out(f"train-{what}-{run.model.pos_encoding}")


def _format_metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


PROBE_SECTIONS = ("model", "analysis", "probe")


def _title(run_dir: Path | None) -> str:
    if run_dir is None:
        return "random-init model"
    hf_path = _hf_path(run_dir)
    return f"Hugging Face model {hf_path}" if hf_path else f"trained model {run_dir}"


def _probe_settings(data: dict[str, Any], flags: dict[str, Any]) -> Any:
    """The validated [probe] settings: the config file's table with the flags laid over it."""
    from nopelab.config import ProbeConfig, build

    _merge(data, "probe", flags)
    return build(ProbeConfig, data["probe"], "config.probe")


@app.command()
def probe(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            help="A training run directory: probe its trained model (default input: its own "
            "held-out data); or hf:PATH, a Hugging Face model folder or .gguf file (default "
            "input: text). Without it, a randomly initialised model is built from the flags."
        ),
    ] = None,
    config: ConfigFile = None,
    pos_encoding: PosEncoding = None,
    nope_layers: NopeLayers = None,
    layers: Layers = None,
    heads: Heads = None,
    d_model: DModel = None,
    vocab_size: VocabSize = None,
    max_seq_len: MaxSeqLen = None,
    bidirectional: Bidirectional = None,
    norm: Norm = None,
    norm_position: NormPosition = None,
    bias: Bias = None,
    init: Init = None,
    init_std: InitStd = None,
    mlp: Mlp = None,
    seq_len: SeqLen = None,
    samples: Samples = None,
    batch_size: BatchSize = None,
    input: Input = None,
    sites: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: embed,attn_heads,attn_out,resid_mid,mlp_out,resid_post "
            "\\[embed,resid_post]",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    dtype: Dtype = None,
    seed: Seed = None,
    device: Device = None,
    probe_layers: ProbeLayers = None,
    probes: Probes = None,
    features: Features = None,
    target: Target = None,
    split: Split = None,
    probe_seeds: ProbeSeeds = None,
    epochs: Epochs = None,
    hidden: Hidden = None,
    text: Text = None,
    max_layers: MaxLayers = None,
    trust_remote_code: TrustRemoteCode = False,
    rope_off: RopeOff = None,
    out: Out = None,
    force: Force = False,
) -> None:
    """Fit position probes on a model's activations: accuracy and MAD (classifiers), MAE and
    Pearson r (regressors), per site and layer, against the predict-the-middle baseline."""
    arguments = dict(locals())
    from nopelab.config import read_config_file
    from nopelab.probe_report import write_probes
    from nopelab.probing import probe_model
    from nopelab.rundir import check_out, default_out, staged_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    out = out or default_out(f"probe-{Path(str(run_dir)).name}" if run_dir else "probe")
    check_out(out, force, _inputs(run_dir))
    cfg, model, source = _model_and_analysis(
        run_dir, data, _model_flags(arguments), _analysis_flags(arguments),
        {"sites": ["embed", "resid_post"]}, PROBE_SECTIONS,
        hf_flags={name: arguments[name] for name in HF_FLAGS}, statistics=False,
    )  # fmt: skip
    probe_cfg = _probe_settings(data, _probe_flags(arguments))
    with staged_run(out, force, _inputs(run_dir), command="probe") as staging:
        start = time.perf_counter()
        rows = probe_model(model, cfg.analysis, probe_cfg, source)
        title = _title(run_dir)
        config_dict = {**cfg.to_dict(), "probe": dataclasses.asdict(probe_cfg)}
        write_probes(staging, config_dict, rows, time.perf_counter() - start, title)
    typer.echo(f"wrote {out}")


@app.command("compare-signals")
def compare_signals(
    run_dirs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Training run directories: each is probed at its initial and its trained "
            "weights. Without any, one randomly initialised model is built from the flags."
        ),
    ] = None,
    config: ConfigFile = None,
    pos_encoding: PosEncoding = None,
    nope_layers: NopeLayers = None,
    layers: Layers = None,
    heads: Heads = None,
    d_model: DModel = None,
    vocab_size: VocabSize = None,
    max_seq_len: MaxSeqLen = None,
    bidirectional: Bidirectional = None,
    norm: Norm = None,
    norm_position: NormPosition = None,
    bias: Bias = None,
    init: Init = None,
    init_std: InitStd = None,
    mlp: Mlp = None,
    seq_len: SeqLen = None,
    samples: Samples = None,
    batch_size: BatchSize = None,
    input: Input = None,
    sites: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: embed,attn_heads,attn_out,resid_mid,mlp_out,resid_post "
            "\\[attn_out,resid_post]",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    dtype: Dtype = None,
    seed: Seed = None,
    device: Device = None,
    probe_layers: ProbeLayers = None,
    probes: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: linear-reg,mlp-reg (regressors) \\[mlp-reg]",
            rich_help_panel=PROBE,
        ),
    ] = None,
    features: Annotated[
        str | None,
        typer.Option(
            help="Feature sets to compare \\[variance,norm,cos_last,cos_row,raw]; raw is the "
            "whole vector, for reference",
            rich_help_panel=PROBE,
        ),
    ] = None,
    target: Target = None,
    split: Split = None,
    probe_seeds: ProbeSeeds = None,
    epochs: Epochs = None,
    hidden: Hidden = None,
    out: Out = None,
    force: Force = False,
) -> None:
    """Which signal carries position: variance alone, norm alone or cosine similarity alone?

    Regression probes per layer for random-init and trained models, a verdict table, a figure.
    """
    arguments = dict(locals())
    from nopelab.analysis import build_model
    from nopelab.config import read_config_file
    from nopelab.probe_report import write_probes
    from nopelab.probing import probe_model
    from nopelab.rundir import default_out, staged_run
    from nopelab.signals import verdict
    from nopelab.train import read_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    defaults = {"sites": ["attn_out", "resid_post"]}
    flags = _probe_flags(arguments)
    for key, value in {
        "probes": ("mlp-reg",),
        "features": ("variance", "norm", "cos_last", "cos_row", "raw"),
    }.items():
        if flags[key] is None and key not in data.get("probe", {}):
            flags[key] = value
    models = []  # (label, state, model, analysis, source)
    for run_dir in run_dirs or [None]:
        cfg, model, source = _model_and_analysis(
            run_dir, {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()},
            _model_flags(arguments), _analysis_flags(arguments), defaults, PROBE_SECTIONS,
            statistics=False,
        )  # fmt: skip
        if run_dir is None:
            models.append(("random-init", "init", model, cfg, source))
            continue
        run = read_run(run_dir)
        initial = build_model(run.model, run.train.seed)  # the weights training started from
        models += [
            (run_dir.name, "init", initial, cfg, source),
            (run_dir.name, "trained", model, cfg, source),
        ]
    probe_cfg = _probe_settings(data, flags)
    if any(not p.endswith("reg") for p in probe_cfg.probes):
        raise UserError("--probes: compare-signals uses regression probes: linear-reg, mlp-reg")
    out = out or default_out("compare-signals")
    with staged_run(out, force, _inputs(*run_dirs), command="compare-signals") as staging:
        start = time.perf_counter()
        rows = []
        for label, state, model, cfg, source in models:
            rows += probe_model(
                model, cfg.analysis, probe_cfg, source, f"{label} {state}",
                labels={"model": label, "state": state},
            )  # fmt: skip
        config_dict = {
            "runs": [str(r) for r in run_dirs or []],
            **models[0][3].to_dict(),
            "probe": dataclasses.asdict(probe_cfg),
        }
        title = "variance, norm or similarity?"
        seconds = time.perf_counter() - start
        write_probes(staging, config_dict, rows, seconds, title, verdict(rows))
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


@app.command()
def intervene(
    run_dir: Annotated[Path, typer.Argument(help="A training run directory")],
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML, YAML or JSON with \\[intervention], \\[analysis] and \\[probe] tables; flags override it.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    site: Annotated[
        str | None,
        typer.Option(
            help="embed | attn_heads | attn_out | resid_mid | mlp_out | resid_post \\[attn_out]"
        ),
    ] = None,
    at_layers: Annotated[
        str | None, typer.Option(help="Layers to intervene at, e.g. 1,2 \\[every layer]")
    ] = None,
    interventions: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: equalize-norm, shuffle-norm (its control), leace, "
            "leace-shuffled and leace-rotated (its controls; rotated is size-matched) \\[all]"
        ),
    ] = None,
    concept: Annotated[
        str | None,
        typer.Option(help="What LEACE erases: onehot (every position class) | scalar \\[onehot]"),
    ] = None,
    fit_samples: Annotated[
        int | None, typer.Option(help="Held-out sequences to fit the edits on [64]")
    ] = None,
    eval_samples: Annotated[
        int, typer.Option(help="Task: test examples decoded per evaluation")
    ] = 256,
    seq_len: Annotated[
        int | None, typer.Option(help="Sequence length \\[the run's training length]")
    ] = None,
    samples: Annotated[int | None, typer.Option(help="Sequences the probes see [64]")] = None,
    probes: Probes = None,
    features: Features = None,
    probe_seeds: ProbeSeeds = None,
    epochs: Epochs = None,
    seed: Seed = None,
    device: Device = None,
    out: Out = None,
    force: Force = False,
) -> None:
    """Edit one site of a trained model (norm equalisation, LEACE position erasure, and their
    controls) and measure what its behaviour and the downstream probes lose, per layer."""
    from nopelab.config import (
        AnalysisConfig,
        InterventionConfig,
        ProbeConfig,
        build,
        read_config_file,
    )
    from nopelab.interventions import run_interventions, write_interventions
    from nopelab.rundir import default_out, staged_run
    from nopelab.train import read_run

    data: dict[str, Any] = read_config_file(config) if config else {}
    sections = ("intervention", "analysis", "probe")
    unknown = set(data) - set(sections)
    if unknown:
        raise UserError(
            f"config: unknown section {sorted(unknown)[0]!r}; allowed: {', '.join(sections)}"
        )
    run = read_run(run_dir)
    _merge(data, "intervention", {
        "site": site, "layers": _ints(at_layers, "--at-layers"),
        "interventions": _words(interventions), "concept": concept, "fit_samples": fit_samples,
    })  # fmt: skip
    _merge(
        data, "analysis", {"seq_len": seq_len, "samples": samples, "seed": seed, "device": device}
    )
    data["analysis"].setdefault("seq_len", run.train.seq_len)
    data["analysis"].setdefault("input", "data")
    _merge(data, "probe", {
        "probes": _words(probes), "features": _words(features), "seeds": probe_seeds,
        "epochs": epochs,
    })  # fmt: skip
    data["probe"].setdefault("probes", ["linear-cls", "mlp-reg"])
    cfg = build(InterventionConfig, data["intervention"], "config.intervention")
    analysis = build(AnalysisConfig, data["analysis"], "config.analysis")
    probe_cfg = build(ProbeConfig, data["probe"], "config.probe")
    if eval_samples < 1:
        raise UserError(f"--eval-samples: must be >= 1, got {eval_samples}")
    out = out or default_out(f"intervene-{run_dir.name}")
    with staged_run(out, force, _inputs(run_dir), command="intervene") as staging:
        rows = run_interventions(run_dir, cfg, probe_cfg, analysis, eval_samples=eval_samples)
        config_dict = {
            "run": str(run_dir),
            "intervention": dataclasses.asdict(cfg),
            "analysis": dataclasses.asdict(analysis),
            "probe": dataclasses.asdict(probe_cfg),
        }
        write_interventions(staging, rows, config_dict, title=f"trained model {run_dir}")
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


@app.command()
def reproduce(
    paper: Annotated[str, typer.Argument(help="chi2023 | zuo2025 | haviv2022 | real-model")],
    part: Annotated[
        str | None,
        typer.Option(
            help="chi2023: random-init | pretrained; zuo2025: random-init | trained | probes; "
            "haviv2022: pretrained; real-model: smollm2"
        ),
    ] = None,
    scale: Annotated[
        str,
        typer.Option(
            help="smoke | small | medium (zuo2025 trained and probes: Zuo's task lengths, "
            "~3 h on a CPU) | paper (full sizes, GPU advised)"
        ),
    ] = "small",
    seed: Annotated[int, typer.Option(help="Seed for weights and inputs")] = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda[:N]")] = "auto",
    out: Annotated[
        Path | None, typer.Option(help="Run directory \\[runs/PAPER-SCALE-TIMESTAMP]")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue an interrupted run in --out (zuo2025 trained and probes): finished "
            "models are kept, an interrupted one continues from its checkpoint"
        ),
    ] = False,
    models: Annotated[
        Path | None,
        typer.Option(
            help="zuo2025 probes: take the NoPE models from this finished `--part trained` run "
            "(same --scale, --seed, --device) instead of training them again"
        ),
    ] = None,
) -> None:
    """Reproduce a paper's results at a chosen scale, with figures and a markdown summary."""
    from nopelab.experiments import EXPERIMENTS
    from nopelab.rundir import default_out, resumable_run, staged_run

    if paper not in EXPERIMENTS:
        raise UserError(f"paper: unknown {paper!r}; allowed: {', '.join(EXPERIMENTS)}")
    experiment = EXPERIMENTS[paper]
    part = part or experiment.default_part
    if part not in experiment.parts:
        raise UserError(
            f"--part: {paper} has no part {part!r}; allowed: {', '.join(experiment.parts)}"
        )
    runner = experiment.parts[part]
    scales = (
        ("smoke", "small", "medium", "paper") if runner.resumable else ("smoke", "small", "paper")
    )
    if scale not in scales:
        raise UserError(f"--scale: unknown {scale!r}; allowed: {', '.join(scales)}")
    if resume and not runner.resumable:
        raise UserError(
            f"--resume: {paper} --part {part} cannot be resumed; "
            "allowed for zuo2025 --part trained and probes"
        )
    if resume and (out is None or force):
        raise UserError("--resume: give the run folder with --out (and no --force)")
    out = out or default_out(f"{paper}-{part}-{scale}")
    from nopelab.runtime import resolve_device

    resolve_device(device)
    settings = runner.settings(scale, seed, device)  # validates before any output exists
    if models is not None:
        if (paper, part) != ("zuo2025", "probes"):
            raise UserError("--models: only for zuo2025 --part probes")
        from nopelab.experiments.zuo2025_probes import reuse_models

        settings = reuse_models(settings, models)
    if not runner.resumable:
        with staged_run(out, force, (), command="reproduce") as staging:
            runner.run(settings, staging)
        typer.echo(f"wrote {out}; see {out / 'summary.md'}")
        return
    marker = {"paper": paper, "part": part, "scale": scale, "seed": seed, "device": device}
    if models is not None:
        marker["models"] = str(settings.models)
    with resumable_run(out, marker, resume, force, _inputs(models)) as folder:
        try:
            runner.run(settings, folder)
        except KeyboardInterrupt:
            again = shlex.join(
                [
                    "nopelab",
                    "reproduce",
                    paper,
                    "--part",
                    part,
                    "--scale",
                    scale,
                    "--seed",
                    str(seed),
                    "--device",
                    device,
                    "--out",
                    str(out),
                    "--resume",
                    *(["--models", str(models)] if models is not None else []),
                ]
            )
            typer.echo(
                f"nopelab: interrupted; finished models are kept: continue with {again}", err=True
            )
            sys.exit(130)
    typer.echo(f"wrote {out}; see {out / 'summary.md'}")


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A training run directory")],
    out: Annotated[Path, typer.Option(help="Folder for the Hugging Face model")],
    seed: Annotated[int, typer.Option(help="Seed of the batch the logit check runs on")] = 0,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out")] = False,
) -> None:
    """Export a trained model as an equivalent Hugging Face model (GPT-2, Llama or SmolLM3),
    checked to give the same logits; load it with AutoModelForCausalLM.from_pretrained(OUT)."""
    from nopelab.hf.export import export_run, family
    from nopelab.rundir import staged_run
    from nopelab.train import read_run

    family(read_run(run_dir).model)  # an unexportable config fails before anything is written
    with staged_run(out, force, _inputs(run_dir), command="export") as staging:
        name = export_run(run_dir, staging, seed, shown_as=out)
    typer.echo(f"wrote {out} ({name})")


def main() -> None:
    """Entry point: user errors become one line on stderr and exit status 2, a failed run 1,
    an interrupt (SIGINT or SIGTERM) 130."""
    keep_freed_memory()
    # `kill`, `timeout` and job schedulers send SIGTERM: it stops a run as Ctrl-C does
    previous = signal.signal(signal.SIGTERM, _interrupt)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _redeliver_interrupt
    try:
        _run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = previous_hook


def _run() -> None:
    try:
        code = app(standalone_mode=False)  # typer turns Ctrl-C inside a command into 130
        if code == 130:
            typer.echo(INTERRUPTED, err=True)
        if code:
            sys.exit(code)
    except UserError as exc:
        typer.echo(f"nopelab: error: {_as_typed(exc)}", err=True)
        sys.exit(2)
    except RunFailed as exc:
        typer.echo(f"nopelab: error: {exc}", err=True)
        sys.exit(1)
    except typer.Abort:
        typer.echo("nopelab: aborted", err=True)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors from the parser (unknown flag, bad int)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        opts = getattr(getattr(exc, "param", None), "opts", None)
        if opts and message and getattr(exc, "message", None):  # a flag's value: name the flag
            typed = [o for o in opts if _was_typed(o, sys.argv)]
            message = f"{(typed or opts)[0]}: {exc.message[0].lower()}{exc.message[1:]}"
        if message:  # empty when the parser has already printed the help instead
            typer.echo(f"nopelab: error: {message}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        sys.exit(130)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        where = f" while writing {exc.filename}" if exc.filename else ""
        typer.echo(f"nopelab: error: {exc.strerror}{where}; nothing half-written is kept", err=True)
        sys.exit(1)


INTERRUPTED = "nopelab: interrupted; nothing was written"

SECTIONS = {"model", "analysis", "train", "task", "corpus", "probe", "intervention"}
# config fields set by a flag of another name: everywhere, and per command
RENAMED = {"n_layers": "layers", "n_heads": "heads", "seeds": "probe_seeds"}
RENAMED_IN = {
    "probe": {"layers": "probe_layers"},
    "compare-signals": {"layers": "probe_layers"},
    "intervene": {"layers": "at_layers"},
}


def _as_typed(exc: UserError) -> str:
    """The error, naming the flag the user typed (``--layers``) rather than the config field it
    sets (``n_layers``); a value that came from a config file keeps the field's name."""
    from nopelab.errors import ConfigError

    argv = sys.argv[1:]
    if not isinstance(exc, ConfigError) or not argv:
        return str(exc)
    field = exc.field.rsplit(".", 1)[-1]
    if "." in exc.field and field in SECTIONS:  # a [section] of a config file, not a flag
        return str(exc)
    name = RENAMED_IN.get(argv[0], {}).get(field) or RENAMED.get(field, field)
    flag = "--" + name.replace("_", "-")
    values = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(f"{flag}="):
            values.append(arg.split("=", 1)[1])
    # the flag was typed, and (when the message quotes the bad value) with that value: a
    # same-named setting in another section of a config file keeps its own name
    got = exc.message.rsplit("got ", 1)[1] if "got " in exc.message else None
    if _was_typed(flag, argv) and (got is None or any(_same_value(v, got) for v in values)):
        return f"{flag}: {exc.message}"
    return str(exc)


def _was_typed(flag: str, argv: list[str]) -> bool:
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in argv)


def _same_value(typed: str, got: str) -> bool:
    """Whether a flag's text is the value an error message quotes (``1e400`` is ``inf``)."""
    if typed in got:
        return True
    try:
        return float(typed) == float(got.strip("'\""))
    except ValueError:
        return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _redeliver_interrupt(unraisable: Any) -> None:
    """An interrupt raised while C code was calling back into Python (numba compiling a kernel)
    is swallowed there: deliver it again a moment later, back in ordinary Python code."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
    else:
        sys.__unraisablehook__(unraisable)
