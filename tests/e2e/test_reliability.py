"""Bad input to every command, as a table: exit status 2, one line naming the flag, no
traceback, and nothing written (the current folder and the input run untouched)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import run_cli

SEED = "--seed: must be an int in 0..9223372036854775807, got -1"  # one rule for every seed
BAD_INPUT = {
    "analyze": [
        ("--layers 0", "--layers: must be > 0"),
        ("--layers two", "--layers: input should be a valid integer"),
        ("--layers 1e9", "--layers: input should be a valid integer"),
        ("--layers 1000000000", "--layers, --d-model or --vocab-size: analysing needs about"),
        ("--heads 0", "--heads: must be > 0"),
        ("--d-model 10 --heads 3", "--d-model: 10 is not divisible by n_heads=3"),
        ("--seq-len 2", "--seq-len: must be >= 3"),
        ("--seq-len 2000000", "--seq-len or --sites: analysing needs about"),
        ("--samples 0", "--samples: must be > 0"),
        ("--samples 99999999999999999999999", "--samples: must be at most 2147483647"),
        ("--batch-size 0", "--batch-size: must be > 0"),
        ("--init-std nan", "--init-std: must be a finite number"),
        ("--init-std inf", "--init-std: must be a finite number"),
        ("--dtype float8", "--dtype: unknown value 'float8'"),
        ("--device gpu", "--device: unknown device 'gpu'"),
        ("--norm batch", "--norm: unknown value 'batch'"),
        ("--mlp relu", "--mlp: unknown value 'relu'"),
        ("--pos-encoding fourier", "--pos-encoding: unknown value 'fourier'"),
        ("--nope-layers 0 --pos-encoding rope", "--nope-layers: layer 0 is outside 1..6"),
        ("--sites attn_out,qkv", "--sites: unknown value 'qkv'"),
        ("--seed x", "--seed: input should be a valid integer"),
        ("--seed -1", SEED),
        ("--seed 9223372036854775808", "--seed: must be an int in 0..9223372036854775807"),
        ("--config missing.toml", "--config:"),
        ("--no-such-flag", "No such option: --no-such-flag"),
        ("RUN --layers 3", "--layers: a trained or Hugging Face model fixes the model"),
        ("RUN --input prompts --seq-len 3", "--seq-len: 3 is shorter than the longest copy"),
        ("RUN --out RUN --force", "--out:"),
        ("RUN --out RUN/inside", "--out:"),
        ("no/such/run", "run: no/such/run has no config.json"),
        ("hf:", "model: hf: needs a path after it"),
        ("--out .", "--out:"),
        ("--out ''", "--out:"),
        ("--out /proc/nopelab", "--out: /proc is not writable"),
        ("--out NOT-UTF-8", "--out: the path is not valid UTF-8"),
        ("--out " + "a" * 300, "--out: the name aaaaaaaaaaaaaaaa… is 300 bytes long; at most 237"),
        ("--out " + "b/" * 2000, "--out: the path is"),
    ],
    "train": [
        ("", "--task or --corpus"),
        ("--task multiply", "--task: unknown value 'multiply'"),
        ("--task copy --max-len 0", "--max-len: 0 is not allowed for copy"),
        ("--task copy --train-size 0", "--train-size: must be > 0"),
        ("--task copy --steps 0", "--steps: must be > 0"),
        ("--task copy --steps 10000000000", "--steps: must be at most 2147483647"),
        ("--task copy --lr inf", "--lr: must be a finite number"),
        ("--task copy --lr 1e400", "--lr: must be a finite number"),
        (
            "--task copy --max-len 100000",
            "--max-len: 100000 is not allowed for copy; allowed: 1..1024",
        ),
        ("--task copy --lr -1", "--lr: must be > 0"),
        ("--task copy --warmup -1", "--warmup: must be >= 0"),
        ("--task copy --grad-clip -1", "--grad-clip: must be >= 0"),
        ("--task copy --dropout 1", "--dropout: must be in [0, 1)"),
        ("--task copy --precision fp8", "--precision: unknown value 'fp8'"),
        ("--task copy --eval-every 0", "--eval-every: must be > 0"),
        ("--task copy --layers 100000", "training needs about"),
        ("--task copy --seq-len 1000000", "--batch-size, --seq-len or --layers: training"),
        ("--task reverse --seq-len 8", "--seq-len: must hold a whole line"),
        ("--task copy --out " + "a" * 300, "--out: the name aaaaaaaaaaaaaaaa… is 300 bytes long"),
        ("--task copy --seed -1", SEED),
        ("--task copy --stop-at 1.5", "--stop-at: must be in (0, 1]"),
        ("--task copy --stop-at nan", "--stop-at: must be a finite number"),
        ("--corpus default --stop-at 0.9", "--stop-at: stops a task run at an accuracy"),
        ("--corpus no/such/file.txt", "--corpus: no such file or folder"),
        ("--corpus sotu+bible", "--corpus: unknown corpus name 'bible' in 'sotu+bible'"),
        ("--corpus default --objective guess", "--objective: unknown value 'guess'"),
        ("--corpus default --objective masked --mask-rate 1", "--mask-rate: must be in (0, 1)"),
        ("--corpus default --bidirectional", "--bidirectional: a bidirectional model sees the"),
        ("--corpus default --objective masked", "--objective: a masked LM attends both ways"),
        ("--task copy --init-from no/such/run", "--init-from: "),
        ("--task copy --init-from RUN", "the model settings must be the same"),
        (
            "--task copy --layers 2 --heads 2 --d-model 16 --max-seq-len 32 --init-from RUN "
            "--out RUN --force",
            "--init-from: ",
        ),
        (
            "--task copy --layers 2 --heads 2 --d-model 16 --max-seq-len 32 --init-from RUN "
            "--out RUN/inside",
            "overlap; a run's input is never its output",
        ),
        ("--corpus default --tokenizer word", "--tokenizer: unknown value 'word'"),
        ("--corpus default --tokenizer bpe --bpe-vocab 100", "--bpe-vocab: must be in 257.."),
        ("--task copy --resume --force --out o", "--resume and --force"),
        ("--resume --out RUN", "--resume: the run in"),  # it has finished
        ("--resume --out RUN --steps 1 --device auto", "finished; pass a larger --steps"),
        (
            "--task add --pos-encoding learned --max-seq-len 16",
            "--max-seq-len: the learned position table must cover the training context of 256",
        ),
        ("--corpus default --tokenizer bpe --bpe-vocab 0", "--bpe-vocab: must be in 257.."),
    ],
    "probe": [
        ("--probes svm", "--probes: unknown value 'svm'"),
        ("--features raw,spin", "--features: unknown value 'spin'"),
        ("--probe-seeds 0", "--probe-seeds: must be > 0"),
        ("--epochs 0", "--epochs: must be > 0"),
        ("--seed -1", SEED),
        ("--split vocab", "--split: vocab builds sequences from token ids"),
        ("--layers 1000000000", "--layers, --d-model or --vocab-size: analysing"),
        ("RUN --probe-layers 5", "--probe-layers: layer 5 does not exist"),
        ("--sites embed,attention", "--sites: probes read activation vectors"),
        ("--out " + "a" * 300, "--out: the name aaaaaaaaaaaaaaaa… is 300 bytes long"),
    ],
    "compare-signals": [
        ("--probe-layers -1", "--probe-layers: expected layer numbers >= 0"),
        ("--samples 0", "--samples: must be > 0"),
    ],
    "intervene": [
        ("RUN --interventions zap", "--interventions: unknown value 'zap'"),
        ("RUN --at-layers 9", "--at-layers: the model has no layer 9"),
        ("RUN --concept color", "--concept: unknown value 'color'"),
        ("RUN --fit-samples 0", "--fit-samples: must be > 0"),
        ("RUN --fit-samples 100000000", "--fit-samples or --seq-len: intervening needs about"),
        ("RUN --site qkv", "--site: unknown value 'qkv'"),
        ("RUN --seed -1", SEED),
        ("no/such/run", "run: no/such/run has no config.json"),
    ],
    "export": [
        ("RUN --out RUN --force", "--out:"),
        ("no/such/run --out o", "run: no/such/run has no config.json"),
        ("RUN", "Missing option '--out'"),
        ("RUN --out o --seed -1", SEED),
        ("RUN --out " + "b/" * 2000, "--out: the path is"),
    ],
    "evaluate": [
        ("RUN", "run: evaluate needs a language model trained on text"),
        ("no/such/run", "run: no/such/run has no config.json"),
        ("RUN --lengths 2,1", "--lengths: expected comma-separated whole numbers >= 1"),
        ("RUN --windows 0", "--windows: must be > 0"),
        ("RUN --shuffle 8,4", "--shuffle: expected prefix lengths >= 0 in increasing order"),
        ("RUN --seed -1", SEED),
        ("RUN --out RUN --force", "--out:"),
    ],
    "headscale": [
        ("RUN --uniform 1.5", "run: headscale needs a language model trained on text"),
        ("no/such/run --uniform 2", "run: no/such/run has no config.json"),
        ("RUN --uniform 0", "--uniform: must be a finite number > 0"),
        ("RUN --length 4 --lr -1", "--lr: must be a finite number > 0"),
        ("RUN", "--length: give the multiple of the training length"),
        ("RUN --uniform 2 --seed -1", SEED),
    ],
    "reproduce": [
        ("vaswani2017", "paper: unknown 'vaswani2017'"),
        ("zuo2025 --part trained-ish", "--part:"),
        ("chi2023 --scale huge", "--scale:"),
        ("chi2023 --device gpu", "--device: unknown device 'gpu'"),
        ("zuo2025 --part trained --layout diagonal", "--layout: unknown layout 'diagonal'"),
        ("chi2023 --layout windows", "--layout: only for zuo2025 --part trained"),
        (
            "zuo2025 --part trained --encodings none,alibi",
            "--encodings: 'alibi' is not trained here; allowed: none, learned, rope",
        ),
        ("zuo2025 --part trained --encodings none,,rope", "--encodings: expected distinct"),
        ("zuo2025 --part probes --encodings none", "--encodings: only for zuo2025 --part trained"),
        (
            "haviv2022 --part sizes --tokenizer wordpiece",
            "--tokenizer: unknown tokenizer 'wordpiece'",
        ),
        ("haviv2022 --part mask --tokenizer bpe", "--tokenizer: only for haviv2022 --part sizes"),
        (
            "haviv2022 --part sizes --scale medium --tokenizer bpe",
            "--tokenizer: --scale medium has no BPE models; scales with them: smoke, small",
        ),
        ("chi2023 --seed x", "--seed: input should be a valid integer"),
        ("wang2024 --scale smoke --seed -1", SEED),
        ("chi2023 --part pretrained --seed 9223372036854775808", "--seed: must be an int in 0.."),
        (
            "wang2024 --scale small --seed 9223372036854775806",  # three seeds from --seed
            "--seed: wang2024 --part lengths --scale small uses seeds --seed to --seed + 2: "
            "allowed 0..9223372036854775805, got 9223372036854775806",
        ),
        ("chi2023 --resume", "--resume:"),
        ("zuo2025 --part trained --models RUN", "--models: only for zuo2025 --part probes"),
        ("zuo2025 --part probes --scale smoke --models RUN", "holds no finished model; give the"),
        ("chi2023 --out " + "a" * 300, "--out: the name aaaaaaaaaaaaaaaa… is 300 bytes long"),
    ],
    "sweep": [
        ("no/such.toml", "GRID: no/such.toml: no such file"),
        ("notes.txt", "GRID: notes.txt:"),
    ],
    "report": [
        ("no/such/dir", "DIR: no/such/dir is not a folder"),
        (".", "DIR: . holds no nopelab run"),
        ("RUN --out page.txt", "--out: page.txt: expected a .html file"),
        ("RUN --out RUN/page.html", "lies inside"),
        ("RUN --out " + "a" * 300 + ".html", "--out: the name aaaaaaaaaaaaaaaa… is 305 bytes"),
        ("RUN --out notes.txt/page.html", "notes.txt is not a folder"),
    ],
}
CASES = [(command, args, message) for command, rows in BAD_INPUT.items() for args, message in rows]


def _tree(*folders: Path) -> dict[str, bytes | None]:
    return {
        str(path): path.read_bytes() if path.is_file() else None
        for folder in folders
        for path in [folder, *folder.rglob("*")]
    }


@pytest.mark.parametrize(
    ("command", "args", "message"), CASES, ids=[" ".join(c[:2]) for c in CASES]
)
def test_bad_input_is_refused_in_one_line_and_writes_nothing(
    command: str, args: str, message: str, finished_run: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    import shlex

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("the user's own file")
    monkeypatch.chdir(workdir)
    argv = [finished_run.as_posix() if a == "RUN" else a for a in shlex.split(args)]
    argv = [a.replace("RUN/", f"{finished_run}/") for a in argv]
    argv = [os.fsdecode(b"caf\xe9") if a == "NOT-UTF-8" else a for a in argv]  # as argv holds it
    before = _tree(workdir, finished_run)
    assert run_cli([command, *argv], monkeypatch) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nopelab: error: "), err
    assert message in err, err
    assert "Traceback" not in captured.out + captured.err
    assert _tree(workdir, finished_run) == before


def test_the_matrix_covers_every_command() -> None:
    from typer.main import get_command

    from nopelab.cli import app

    assert set(BAD_INPUT) == set(get_command(app).commands)
