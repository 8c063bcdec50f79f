"""``nopelab evaluate``: loss by position and perplexity at multiples of the training length."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

import helpers
from helpers import run_cli


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.text_run(tmp_path_factory.mktemp("nope"))


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return helpers.text_run(
        tmp_path_factory.mktemp("learned"), pos_encoding="learned", max_seq_len=16
    )


def test_evaluate_writes_loss_by_position_and_perplexity(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "eval"
    args = ["evaluate", str(text_run), "--lengths", "1,2,4", "--windows", "64", "--buckets", "8"]
    assert run_cli([*args, "--device", "cpu", "--out", str(out)], monkeypatch) == 0
    for name in ("loss_by_position.parquet", "perplexity.parquet", "loss_by_position.png"):
        assert (out / name).stat().st_size > 0
    table = pd.read_parquet(out / "perplexity.parquet")
    assert table["length_factor"].tolist() == [1, 2, 4] and table["length"].tolist() == [16, 32, 64]
    assert (table["loss"] < math.log(256)).all()
    # every held-out window, as the run's own final evaluation takes them
    final = json.loads((text_run / "summary.json").read_text())["final_eval"]
    for factor, key in ((1, "loss"), (2, "loss_2x"), (4, "loss_4x")):
        loss = table.loc[table["length_factor"] == factor, "loss"].item()
        assert loss == pytest.approx(final[key], rel=1e-5)
    positions = pd.read_parquet(out / "loss_by_position.parquet")
    assert list(positions.columns) == [
        "length_factor", "length", "bucket_start", "bucket_end", "loss", "tokens",
    ]  # fmt: skip
    for factor, rows in positions.groupby("length_factor"):
        assert rows["bucket_start"].iloc[0] == 1 and rows["bucket_end"].iloc[-1] == 16 * factor
        assert (
            len(rows) <= 8
            and rows["tokens"].sum() == table.set_index("length_factor").loc[factor, "tokens"]
        )
    config = json.loads((out / "config.json").read_text())
    assert config["source"] == str(text_run) and config["lengths"] == [1, 2, 4]
    assert (config["windows"], config["buckets"], config["seed"]) == (64, 8, 0)
    summary = (out / "summary.md").read_text()
    assert "Flat length" in summary and "at most 10% above" in summary


def test_the_prefix_shuffle_starts_at_the_plain_loss(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "eval"
    args = ["evaluate", str(text_run), "--lengths", "1", "--windows", "20", "--shuffle", "0,1,8,15"]
    assert run_cli([*args, "--device", "cpu", "--out", str(out)], monkeypatch) == 0
    shuffle = pd.read_parquet(out / "shuffle.parquet").set_index("k")
    plain = pd.read_parquet(out / "perplexity.parquet")["loss"].item()
    assert shuffle.loc[0, "loss"] == shuffle.loc[0, "unshuffled_loss"] == pytest.approx(plain)
    assert shuffle.loc[1, "rise"] == 0 and shuffle.loc[8, "rise"] != 0
    assert shuffle["tokens"].tolist() == [20 * 16, 20 * 15, 20 * 8, 20 * 1]
    assert (out / "shuffle.png").stat().st_size > 0 and "## Prefix shuffle" in (
        out / "summary.md"
    ).read_text()


def test_a_shuffle_beyond_the_window_is_refused(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    err = _refused([str(text_run), "--shuffle", "0,16"], tmp_path, monkeypatch, capsys)
    assert "--shuffle: a prefix of 16 tokens is beyond the sequence" in err and "0..15" in err


def test_a_masked_lm_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    run = helpers.text_run(tmp_path / "made", objective="masked", bidirectional=True)
    (tmp_path / "here").mkdir()
    err = _refused([str(run)], tmp_path / "here", monkeypatch, capsys)
    assert "is a masked LM" in err


def _refused(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> str:
    """The one error line of a refused ``nopelab evaluate``, which wrote nothing."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "eval"
    assert run_cli(["evaluate", *args, "--device", "cpu", "--out", str(out)], monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nopelab: error: "), err
    assert list(tmp_path.iterdir()) == []
    return err


@pytest.mark.parametrize("lengths", ["", "2,1", "0", "x"])
def test_bad_lengths_are_refused(
    lengths: str, text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    err = _refused([str(text_run), "--lengths", lengths], tmp_path, monkeypatch, capsys)
    assert err.startswith("nopelab: error: --lengths: expected comma-separated whole numbers")


def test_lengths_the_model_or_the_text_cannot_take_are_refused(
    text_run: Path, learned_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    err = _refused([str(learned_run), "--lengths", "1,2"], tmp_path, monkeypatch, capsys)
    assert "--lengths: 2x is 32 tokens, beyond the learned position table of 16" in err
    err = _refused([str(text_run), "--lengths", "1,64"], tmp_path, monkeypatch, capsys)
    assert "--lengths: 64x" in err and "the held-out text has 450 tokens" in err


def test_a_task_run_is_refused(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    err = _refused([str(finished_run), "--lengths", "1"], tmp_path, monkeypatch, capsys)
    assert "evaluate needs a language model trained on text" in err


def test_hugging_face_options_need_an_hf_model(
    text_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    err = _refused([str(text_run), "--train-len", "8"], tmp_path, monkeypatch, capsys)
    assert err == "nopelab: error: --train-len: only applies to an hf:PATH model"


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (128 positions) with a byte-level BPE tokenizer of the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hf_tiny import tiny

    folder = tmp_path_factory.mktemp("hf") / "llama"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=260, initial_alphabet=alphabet)
    tokenizer.train_from_iterator([helpers.CORPUS], trainer)
    tiny("llama", vocab_size=300).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)
    (folder.parent / "text.txt").write_text(helpers.CORPUS)
    return folder


@pytest.mark.slow
def test_evaluate_a_hugging_face_model(
    hf_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    out, text = tmp_path / "eval", str(hf_llama.parent / "text.txt")
    args = ["evaluate", f"hf:{hf_llama}", "--text", text, "--lengths", "1,2", "--windows", "2"]
    assert run_cli([*args, "--device", "cpu", "--out", str(out)], monkeypatch) == 0
    table = pd.read_parquet(out / "perplexity.parquet")
    assert table["length"].tolist() == [128, 256]  # max_position_embeddings
    assert table["windows"].tolist() == [2, 2] and (table["loss"] < math.log(300) + 1).all()
    config = json.loads((out / "config.json").read_text())
    assert (config["train_len"], config["text"]) == (128, text)
    short = tmp_path / "short"
    assert run_cli([*args, "--train-len", "16", "--out", str(short)], monkeypatch) == 0
    assert pd.read_parquet(short / "perplexity.parquet")["length"].tolist() == [16, 32]
    (tmp_path / "empty").mkdir()
    capsys.readouterr()  # the progress lines of the runs above
    refused = [f"hf:{hf_llama}", "--lengths", "1", "--text", "missing.txt"]
    err = _refused(refused, tmp_path / "empty", monkeypatch, capsys)
    assert err.startswith("nopelab: error: --text: no such file or folder: missing.txt (allowed: ")
