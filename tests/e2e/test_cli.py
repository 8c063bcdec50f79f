"""The command line: outputs of a run, reproducibility, and one-line errors for bad input."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer.main
from typer.testing import CliRunner

from helpers import failure_line, run_cli
from nopelab.cli import app
from nopelab.config import DEFAULT_SITES
from nopelab.extras import EXTRAS
from nopelab.runtime import progress as progress_module

TINY = [
    "--layers",
    "2",
    "--heads",
    "2",
    "--d-model",
    "16",
    "--seq-len",
    "10",
    "--samples",
    "4",
    "--batch-size",
    "2",
    "--device",
    "cpu",
]


def test_analyze_writes_a_complete_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert (
        run_cli(
            [
                "analyze",
                *TINY,
                "--sites",
                f"{','.join(DEFAULT_SITES)},attention",
                "--out",
                str(out),
            ],
            monkeypatch,
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["rows"]) == 1 + 2 * 4  # embed + 4 sites in each of 2 layers
    for row in summary["rows"]:
        for key in (
            "layer",
            "site",
            "adjacency_mean",
            "adjacency_std",
            "norm_score_mean",
            "norm_score_zuo_mean",
            "norm_score_zuo_std",
            "variance_first",
            "variance_last",
        ):
            assert key in row
        assert 0 <= row["adjacency_mean"] <= 1
        assert 0 <= row["norm_score_zuo_mean"] <= 1
    positions = pd.read_parquet(out / "positions.parquet")
    assert {"layer", "site", "position", "variance", "norm"} <= set(positions.columns)
    assert len(positions) == 9 * 10
    cosine = np.load(out / "cosine.npz")
    assert cosine["attn_out_1"].shape == (10, 10)
    assert set(cosine.files) == {"embed_0"} | {
        f"{s}_{l}" for s in ("attn_out", "resid_mid", "mlp_out", "resid_post") for l in (1, 2)
    }
    np.testing.assert_allclose(np.diag(cosine["resid_post_2"]), 1.0, atol=1e-5)
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["n_layers"] == 2 and config["analysis"]["samples"] == 4
    for name in (
        "variance.png",
        "distance.png",
        "cosine_attn_out.png",
        "scores.png",
        "attention.png",
        "summary.md",
        "attention.parquet",
        "attention_heads.parquet",
        "distance.parquet",
    ):
        assert (out / name).stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_the_attention_site_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sites attention`` writes the attention files only, equal to those of a run that
    measures vector sites beside it."""
    alone, beside = tmp_path / "alone", tmp_path / "beside"
    for out, sites in ((alone, "attention"), (beside, "attn_out,attention")):
        assert run_cli(["analyze", *TINY, "--sites", sites, "--out", str(out)], monkeypatch) == 0
    assert sorted(p.name for p in alone.iterdir() if not p.name.startswith(".")) == [
        "attention.parquet",
        "attention.png",
        "attention_heads.parquet",
        "config.json",
        "summary.json",
        "summary.md",
    ]
    assert json.loads((alone / "summary.json").read_text())["rows"] == []
    for name in ("attention.parquet", "attention_heads.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(alone / name), pd.read_parquet(beside / name))


def test_attn_heads_site_is_analysed_and_probed(tmp_path: Path, monkeypatch) -> None:
    """The heads' outputs concatenated, before the output projection, are an opt-in site."""
    out = tmp_path / "analyze"
    assert run_cli(["analyze", *TINY, "--sites", "attn_heads", "--out", str(out)], monkeypatch) == 0
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {(r["site"], r["layer"]) for r in rows} == {("attn_heads", 1), ("attn_heads", 2)}
    assert np.load(out / "cosine.npz")["attn_heads_2"].shape == (10, 10)
    assert (out / "cosine_attn_heads.png").stat().st_size > 0
    out = tmp_path / "probe"
    args = ["probe", "--layers", "2", "--heads", "2", "--d-model", "16", "--seq-len", "10",
            "--samples", "10", "--sites", "attn_heads", "--probes", "linear-reg",
            "--features", "raw", "--probe-seeds", "1", "--epochs", "1", "--out", str(out)]  # fmt: skip
    assert run_cli(args, monkeypatch) == 0
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {(r["site"], r["layer"]) for r in rows} == {("attn_heads", 1), ("attn_heads", 2)}


@pytest.mark.slow
def test_same_seed_same_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        assert (
            run_cli(["analyze", *TINY, "--seed", seed, "--out", str(tmp_path / name)], monkeypatch)
            == 0
        )
        runs.append(pd.read_parquet(tmp_path / name / "positions.parquet"))
    pd.testing.assert_frame_equal(runs[0], runs[1])
    assert not runs[0]["variance"].equals(runs[2]["variance"])


@pytest.mark.slow  # the full suite runs it
@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (
            ".toml",
            "[model]\nn_layers = 1\nd_model = 8\nn_heads = 2\n[analysis]\nseq_len = 6\nsamples = 2\n",
        ),
        (
            ".yaml",
            "model:\n  n_layers: 1\n  d_model: 8\n  n_heads: 2\nanalysis:\n  seq_len: 6\n  samples: 2\n",
        ),
        (
            ".json",
            '{"model": {"n_layers": 1, "d_model": 8, "n_heads": 2}, "analysis": {"seq_len": 6, "samples": 2}}',
        ),
    ],
)
def test_config_files_and_flag_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str, text: str
) -> None:
    config = tmp_path / f"c{suffix}"
    config.write_text(text)
    out = tmp_path / "run"
    assert (
        run_cli(
            [
                "analyze",
                "--config",
                str(config),
                "--samples",
                "3",
                "--device",
                "cpu",
                "--out",
                str(out),
            ],
            monkeypatch,
        )
        == 0
    )
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["model"]["n_layers"] == 1 and resolved["model"]["d_model"] == 8
    assert (
        resolved["analysis"]["seq_len"] == 6 and resolved["analysis"]["samples"] == 3
    )  # flag wins
    # a run's own config.json is a valid config file
    again = tmp_path / "again"
    assert (
        run_cli(["analyze", "--config", str(out / "config.json"), "--out", str(again)], monkeypatch)
        == 0
    )
    assert json.loads((again / "config.json").read_text())["model"] == resolved["model"]


BAD = [
    (["--pos-encoding", "fourier"], "--pos-encoding"),
    (["--init", "orthogonal"], "--init"),
    (["--d-model", "10", "--heads", "3"], "--d-model"),
    (["--init-std", "0"], "--init-std"),
    (["--init-std", "-1"], "--init-std"),
    (["--pos-encoding", "learned", "--max-seq-len", "8", "--seq-len", "10"], "--seq-len"),
    (["--input", "images"], "--input"),
    (["--sites", "attn_out,qkv"], "--sites"),
    (["--nope-layers", "1,x"], "--nope-layers"),
    (["--nope-layers", "5", "--pos-encoding", "rope"], "--nope-layers"),
    (["--layers", "two"], "--layers"),
    (["--layers", "0"], "--layers"),  # the config field is n_layers; the error names the flag
    (["--heads=0"], "--heads"),
    (
        ["--device", "cuda:0"]
        if not __import__("torch").cuda.is_available()
        else ["--device", "tpu"],
        "--device",
    ),
    (["--config", "missing.toml"], "--config"),
    (["--config", "settings.ini"], "--config"),
]


@pytest.mark.parametrize(("args", "field"), BAD)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, args: list[str], field: str, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = run_cli(["analyze", *TINY, *args, "--out", str(out)], monkeypatch)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"nopelab: error: {field}"), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["probe", "--probe-seeds", "0"], "--probe-seeds"),
        (["probe", "--probe-layers", "-1"], "--probe-layers"),
        (["compare-signals", "--probe-layers", "-1"], "--probe-layers"),
        (["reproduce", "chi2023", "--device", "gpu"], "--device"),
    ],
)
def test_errors_name_the_flag_that_was_typed(
    tmp_path: Path, args: list[str], flag: str, capsys, monkeypatch
) -> None:
    out = tmp_path / "run"
    assert run_cli([*args, "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"nopelab: error: {flag}"), err
    assert not out.exists()


def test_non_finite_activations_fail_the_run(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"  # weights of scale 1e30: their squares overflow float32
    assert run_cli(["analyze", *TINY, "--init-std", "1e30", "--out", str(out)], monkeypatch) == 1
    assert "are not finite" in failure_line(capsys.readouterr().err)
    assert not out.exists()


def test_a_config_file_error_is_not_blamed_on_a_typed_flag(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    (tmp_path / "probe.toml").write_text("[probe]\nbatch_size = 0\n")
    (tmp_path / "task.toml").write_text("[task]\nmaxlen = 3\n")
    for argv, shown in (
        (["probe", "--config", "probe.toml", "--batch-size", "8"], "batch_size: must be > 0"),
        (["train", "--config", "task.toml", "--task", "add"], "config.task: unknown key 'maxlen'"),
    ):
        monkeypatch.chdir(tmp_path)
        assert run_cli([*argv, "--out", str(tmp_path / "o")], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"nopelab: error: {shown}"), err  # not --batch-size or --task
    assert not (tmp_path / "o").exists()


def test_a_field_of_two_sections_names_the_flag_of_its_own(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # batch_size is a field of [analysis] (--batch-size) and of [probe] (--probe-batch-size)
    for flag in ("--batch-size", "--probe-batch-size"):
        argv = ["probe", *TINY, flag, "0", "--out", str(tmp_path / "o")]
        assert run_cli(argv, monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"nopelab: error: {flag}: must be > 0"), err
    assert not (tmp_path / "o").exists()


def test_malformed_config_file(tmp_path: Path, capsys, monkeypatch) -> None:
    for name, text in (
        ("bad.toml", "[model\nx = 1"),
        ("bad.yaml", "model: [1, 2"),
        ("bad.json", "{"),
        ("keys.toml", "[model]\nwidth = 3\n"),
        ("section.toml", "[trainer]\nx = 1\n"),
    ):
        (tmp_path / name).write_text(text)
        code = run_cli(
            ["analyze", "--config", str(tmp_path / name), "--out", str(tmp_path / "o")], monkeypatch
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "config" in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_existing_output_needs_force(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert run_cli(["analyze", *TINY, "--out", str(out)], monkeypatch) == 2
    assert "--force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / ".nopelab-run.json").write_text("{}")  # what every nopelab run folder holds
    assert run_cli(["analyze", *TINY, "--out", str(out), "--force"], monkeypatch) == 0
    assert (out / "summary.json").exists() and not (out / "keep.txt").exists()
    # an empty folder is fine without --force
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli(["analyze", *TINY, "--out", str(empty)], monkeypatch) == 0


def test_unwritable_output(tmp_path: Path, capsys, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run_cli(["analyze", *TINY, "--out", str(blocker / "run")], monkeypatch) == 2
    assert "--out" in capsys.readouterr().err
    assert run_cli(["analyze", *TINY, "--out", str(blocker)], monkeypatch) == 2
    assert blocker.read_text() == "x"


def test_a_corpus_name_that_is_also_a_file_here_is_refused(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("sotu+default").write_text("the user's own text")
    assert run_cli(["train", "--corpus", "sotu+default", "--steps", "1"], monkeypatch) == 2
    assert capsys.readouterr().err.strip() == (
        "nopelab: error: --corpus: 'sotu+default' names embedded corpora and also a file or "
        "folder here; write ./sotu+default for the file or folder"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["sotu+default"]


def test_reproduce_rejects_unknown_names(tmp_path: Path, capsys, monkeypatch) -> None:
    for args, field in (
        (["reproduce", "vaswani2017"], "paper"),
        (["reproduce", "zuo2025", "--part", "trained-ish"], "--part"),
        (["reproduce", "chi2023", "--scale", "huge"], "--scale"),
        (["reproduce", "chi2023", "--scale", "medium"], "--scale"),  # zuo2025 trained/probes
        (["reproduce", "chi2023", "--resume"], "--resume"),
        (["reproduce", "zuo2025", "--part", "trained", "--resume"], "--resume"),  # a folder?
        (["reproduce", "chi2023", "--samples", "32,256"], "--samples"),  # not this part
        *(
            (["reproduce", "chi2023", "--part", "probe-study", "--samples", samples], "--samples")
            for samples in ("", "256,32", "32,32", "1,8", "8,x", "-4", "100000000")
        ),
        (["reproduce", "chi2023", "--part", "pretrained", "--sizes", "24x2"], "--sizes"),
        *(
            (["reproduce", "haviv2022", "--part", "sizes", "--sizes", sizes], "--sizes")
            for sizes in (
                *("", "48x2,24x2", "24x2,24x2", "24", "24x2x5", "ax2", "0x2"),
                *("24x2,65536x64", "24x2,100000000x100000"),  # too large to train here
            )
        ),
        (["reproduce", "zuo2025", "--part", "trained", "--corpus", "sotu"], "--corpus"),
        *(
            (["reproduce", "wang2024", "--corpus", corpus], "--corpus")
            for corpus in ("", "bible", "sotu+", "web.txt", "sotu+default+x", "sotu+sotu")
        ),
    ):
        assert run_cli([*args, "--out", str(tmp_path / "o")], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and field in err, err
    assert not (tmp_path / "o").exists()
    for args in (["--force"], []):  # --resume needs --out without --force; o holds no run
        argv = ["reproduce", "zuo2025", "--part", "trained", "--resume", *args]
        assert run_cli([*argv, "--out", str(tmp_path / "o")], monkeypatch) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--resume" in err, err
    assert not (tmp_path / "o").exists()


def test_an_option_at_its_default_is_the_same_run(tmp_path: Path, capsys, monkeypatch) -> None:
    """A run started without --corpus resumes with --corpus default, and the other way round."""
    out = tmp_path / "finished"
    out.mkdir()
    stored = {"paper": "chi2023", "part": "pretrained", "scale": "smoke", "seed": 0}
    (out / "reproduction.json").write_text(json.dumps({**stored, "device": "cpu"}))
    (out / "summary.md").write_text("done")
    argv = ["reproduce", "chi2023", "--part", "pretrained", "--scale", "smoke", "--device", "cpu"]
    for given in ([], ["--corpus", "default"]):
        assert run_cli([*argv, *given, "--out", str(out), "--resume"], monkeypatch) == 2
        assert "has already finished" in capsys.readouterr().err  # the markers agreed
    assert run_cli([*argv, "--corpus", "sotu", "--out", str(out), "--resume"], monkeypatch) == 2
    message = "--resume: corpus is 'sotu' but the run was started with the scale's own"
    assert message in capsys.readouterr().err
    # --scale large trains on sotu+default: naming it is the same run, naming default is not
    large = {**stored, "scale": "large", "device": "cpu"}
    (out / "reproduction.json").write_text(json.dumps(large))
    argv[argv.index("smoke")] = "large"
    for given in ([], ["--corpus", "sotu+default"]):
        assert run_cli([*argv, *given, "--out", str(out), "--resume"], monkeypatch) == 2
        assert "has already finished" in capsys.readouterr().err
    assert run_cli([*argv, "--corpus", "default", "--out", str(out), "--resume"], monkeypatch) == 2
    assert (
        "corpus is 'default' but the run was started with the scale's own"
        in capsys.readouterr().err
    )


def test_fewer_samples_resume_where_the_scales_own_would_not_fit(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """--samples under a scale whose own counts this machine refuses: the run is the one with the
    given counts (stored in its marker), and resuming it with them is the same run."""
    from nopelab.errors import UserError
    from nopelab.experiments.chi2023 import probe_study as chi2023_probe_study

    real = chi2023_probe_study.check_memory

    def small_only(study: chi2023_probe_study.Settings) -> None:
        if max(study.samples) > 4:
            raise UserError("--samples: too many for this machine")
        real(study)

    monkeypatch.setattr(chi2023_probe_study, "check_memory", small_only)
    out = tmp_path / "finished"
    out.mkdir()
    stored = {"paper": "chi2023", "part": "probe-study", "scale": "smoke", "seed": 0}
    (out / "reproduction.json").write_text(json.dumps({**stored, "device": "cpu", "samples": [4]}))
    (out / "summary.md").write_text("done")
    argv = ["reproduce", "chi2023", "--part", "probe-study", "--scale", "smoke", "--device", "cpu"]
    assert run_cli([*argv, "--samples", "4", "--out", str(out), "--resume"], monkeypatch) == 2
    assert "has already finished" in capsys.readouterr().err


def test_real_process_prints_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nopelab", "analyze", "--heads", "5", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "nopelab: error: d_model: 384 is not divisible by n_heads=5"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_every_help_text_is_shown_whole() -> None:
    # typer renders help with rich markup: an unescaped "[probe]" or "[gelu]" silently vanishes
    for name, command in typer.main.get_command(app).commands.items():
        shown = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "400"}).output
        shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", shown).split())
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            first = text.split("\n\n")[0]  # the docstring's first paragraph
            assert " ".join(first.replace("\\[", "[").split()) in shown, (name, text)


# ------------------------------------------------------------------ progress and interrupts


def test_a_long_stage_prints_a_line_per_tenth_where_no_bar_is_shown(capsys, monkeypatch) -> None:
    clock = iter(range(0, 10_000, 2))  # two seconds pass between any two readings
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(progress_module, "_STARTED", 0)
    with progress_module.progress("work", total=20) as advance:
        for _ in range(20):
            advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("work (") and lines[0].endswith(" s)")
    assert [line.split(" (")[0] for line in lines[1:]] == [
        f"work: {p} %" for p in range(10, 101, 10)
    ]
    seconds = [int(re.fullmatch(r".* \((\d+) s\)", line).group(1)) for line in lines]
    assert seconds == sorted(seconds)


def test_a_quick_stage_prints_its_start_and_end_only(capsys, monkeypatch) -> None:
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: 5.0)  # no time passes
    monkeypatch.setattr(progress_module, "_STARTED", 0)
    with progress_module.progress("quick", total=8) as advance:
        for _ in range(4):
            advance(2)
    with progress_module.progress("hidden", total=8, visible=False) as advance:
        advance(8)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["quick", "quick: 100 %"]


@pytest.mark.slow
def test_a_reproduction_in_a_log_says_what_it_does(tmp_path: Path) -> None:
    """``nopelab reproduce chi2023 > log 2>&1``: a line within seconds, then one per stage."""
    out = tmp_path / "chi"
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopelab", "reproduce", "chi2023", "--scale", "smoke",
         "--device", "cpu", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    arrived = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stdout]
    assert proc.wait(timeout=60) == 0, arrived
    assert arrived and arrived[0][0] < 10, arrived  # says what it does long before it is done
    lines = [line for _, line in arrived]
    stages = [
        "chi2023: building the model (d=64, 4 heads, 3 layers)",
        "chi2023: analysing 8 samples at T=64",
        "chi2023: analysing 8 samples at T=64: 100 %",
        "chi2023: writing the statistics' tables and figures",
        "chi2023 probes: collecting 16 samples at T=64, 6 sites and layers",
        "chi2023 probes: collecting 16 samples at T=64, 6 sites and layers: 100 %",
        "chi2023 probes: fitting 12 probes, 3 seeds each",
        "chi2023 probes: fitting 12 probes, 3 seeds each: 100 %",
        "chi2023: writing the probe table, figure and summary",
    ]
    shown = [line.rsplit(" (", 1)[0] for line in lines[:-1]]
    assert [line for line in shown if line in stages] == stages, lines
    tenths = r"(chi2023: analysing|chi2023 probes: collecting|chi2023 probes: fitting) .*: \d+ %"
    assert all(re.fullmatch(tenths, line) for line in set(shown) - set(stages)), lines
    for at, line in arrived[:-1]:  # each line tells the time since the command started
        told = int(re.fullmatch(r".* \((\d+) s\)", line).group(1))
        assert told <= at + 1, (at, line)
    assert lines[-1] == f"wrote {out}; see {out / 'summary.md'}"


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum``."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2, 0.5])
def test_an_interrupt_while_the_command_starts_is_one_line(delay: float, tmp_path: Path) -> None:
    """Ctrl-C while the command is still importing PyTorch: status 130, no traceback, nothing
    written. The delays count from the moment the entry point has set its handlers (it catches
    SIGTERM): before that only Python's own start-up runs, which nopelab cannot reach."""
    out = tmp_path / "run"
    args = ["train", "--task", "copy", "--steps", "5", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nopelab", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not _catches(proc.pid, signal.SIGTERM):
        assert time.monotonic() < deadline and proc.poll() is None, "the command did not start"
        time.sleep(0.001)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "nopelab: interrupted"
    ), err
    assert list(tmp_path.iterdir()) == []


def test_the_console_script_starts_without_pytorch() -> None:
    """The ``nopelab`` script's entry point sets its interrupt handlers before anything heavy
    loads: importing it must not import PyTorch (whose import takes seconds)."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    module, _, function = pyproject["project"]["scripts"]["nopelab"].partition(":")
    code = f"import sys, {module}; {module}.{function}; print(sorted({{'torch', 'numpy'}} & set(sys.modules)))"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]", shown


def test_version_prints_the_package_version(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from nopelab import __version__

    assert run_cli(["--version"], monkeypatch) == 0
    assert capsys.readouterr().out == f"nopelab {__version__}\n"


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        ("transformers", ["analyze", "hf:MODEL"], "a Hugging Face model (hf:PATH) needs the 'hf'"),
        ("transformers", ["export", "RUN", "--out", "OUT"], "nopelab export needs the 'hf'"),
        (
            "ray",
            ["sweep", "GRID", "--address", "auto"],
            "--address (a Ray cluster) needs the 'ray'",
        ),
    ],
)
def test_a_command_that_needs_a_missing_extra_names_it(
    module: str, args: list[str], message: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The optional packages are extras; without one, the command that needs it stops in one
    line naming the extra (exit 2), before anything is written."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "grid.toml").write_text('command = "analyze"\n[axes]\n"model.n_layers" = [1]\n')
    places = {"hf:MODEL": f"hf:{tmp_path / 'model'}", "RUN": str(tmp_path / "run"),
              "OUT": str(tmp_path / "out"), "GRID": str(tmp_path / "grid.toml")}  # fmt: skip
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    monkeypatch.chdir(tmp_path)
    assert run_cli([places.get(a, a) for a in args], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"nopelab: error: {message} extra ({module} is not installed): "
        f"pip install 'nopelab[{EXTRAS[module]}]'"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml", "model"]


def test_the_default_paths_need_no_extra(tmp_path: Path) -> None:
    """Random and trained native models, analysed and probed, with none of the extras."""
    script = """
import sys
for name in ("transformers", "gguf", "accelerate", "ray", "concept_erasure"):
    sys.modules[name] = None
from nopelab.cli.main import main
for args in (
    ["analyze", "--layers", "1", "--d-model", "16", "--heads", "2", "--seq-len", "16",
     "--samples", "4", "--sites", "attn_out,attention", "--out", "a"],
    ["train", "--task", "copy", "--max-len", "3", "--layers", "1", "--d-model", "16",
     "--heads", "2", "--seq-len", "16", "--batch-size", "4", "--steps", "4", "--out", "t"],
    ["analyze", "t", "--samples", "4", "--out", "b"],
):
    sys.argv = ["nopelab", *args]
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, (args, exc.code)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert {"a", "t", "b"} <= {p.name for p in tmp_path.iterdir()}
