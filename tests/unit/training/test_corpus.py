"""Corpus loading, the embedded default corpus, train/val splits and token windows."""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from nopelab.config import CorpusConfig
from nopelab.errors import ConfigError
from nopelab.training.corpus import (
    TokenStream,
    describe,
    embedded_corpus,
    load_text,
    split_text,
)
from nopelab.training.sources import TextSource, bpe_cache_dir
from nopelab.training.tokenizer import get_tokenizer


def test_default_corpus() -> None:
    text = embedded_corpus("default")
    assert len(text.encode("utf-8")) > 4_000_000
    assert 850_000 < len(text.split()) < 1_000_000
    lines = text.splitlines()
    assert lines[0] == "In the beginning, God created the heavens and the earth."
    assert lines[-1] == "The grace of the Lord Jesus Christ be with all the saints. Amen."
    assert "For God so loved the world, that he gave his only born Son," in text
    assert "<" not in text and ">" not in text and "&amp;" not in text
    assert all(line and line == " ".join(line.split()) for line in lines)
    assert load_text("default") is text


def test_sotu_corpus() -> None:
    text = embedded_corpus("sotu")
    lines = text.splitlines()
    assert len(lines) == 233  # one address per line, 1790 to 2021
    assert lines[0].startswith("Fellow-Citizens of the Senate and House of Representatives:")
    assert lines[-1].endswith(
        "may God protect our troops. Thank you for your patience. (Applause.)"
    )
    assert 1_700_000 < len(text.split()) < 1_900_000
    assert all(line and line == " ".join(line.split()) for line in lines)
    assert load_text("sotu") is text


def test_joined_names_keep_their_order_and_hold_out_the_last() -> None:
    web, sotu = embedded_corpus("default"), embedded_corpus("sotu")
    joined = load_text("sotu+default")
    assert joined == sotu + web  # each ends in a newline already
    train, val = split_text(joined)
    assert web.endswith(val) and train.startswith(sotu)  # the tail is the last-named corpus's
    assert bpe_cache_dir("sotu+default") is None and bpe_cache_dir("sotu") is None


def test_describe_names_what_a_source_holds() -> None:
    assert describe("default") == "the embedded World English Bible"
    both = "the embedded State of the Union addresses 1790-2021 followed by the embedded World"
    assert describe("sotu+default") == both + " English Bible"
    assert describe("my/notes.txt") == "my/notes.txt"


def test_a_corpus_named_twice_is_refused() -> None:  # its held-out tail would be trained on
    for source in ("sotu+sotu", "default+sotu+default"):
        with pytest.raises(ConfigError, match=r"^--corpus: '\w+' appears twice in"):
            load_text(source)


@pytest.mark.parametrize("source", ["data/c++.txt", "my+notes.txt", "sotu+default/x"])
def test_a_missing_path_with_a_plus_is_a_missing_path(source: str) -> None:
    with pytest.raises(
        ConfigError, match=f"^--corpus: no such file or folder: {re.escape(source)} "
    ):
        load_text(source)


@pytest.mark.parametrize("source", ["sotu+bible", "default+", "+sotu"])
def test_unknown_name_in_a_join(source: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^--corpus: unknown corpus name .* \(names: default, sotu\)$"
    ):
        load_text(source)


def test_a_file_named_like_a_join_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("a+b.txt").write_text("file text")
    assert load_text("a+b.txt") == "file text"


def test_a_join_of_names_that_is_also_a_file_here_is_refused_as_ambiguous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which text a run trained on must not depend on the folder it was started in: the name
    and the file are told apart by ./ (a join of unknown names that is a file is the file)."""
    monkeypatch.chdir(tmp_path)
    Path("sotu+default").write_text("the user's own text")
    Path("my+notes").write_text("notes")
    message = r"^--corpus: 'sotu\+default' names embedded corpora and also a file or folder here; "
    with pytest.raises(ConfigError, match=message + r"write \./sotu\+default for the file"):
        load_text("sotu+default")
    # a stored run's config is read from any folder: only what a user types is checked
    assert CorpusConfig(source="sotu+default").source == "sotu+default"
    assert load_text("./sotu+default") == "the user's own text"
    assert load_text("my+notes") == "notes"


def test_load_txt_file(tmp_path: Path) -> None:
    path = tmp_path / "a.md"
    path.write_text("héllo\nworld\n", encoding="utf-8")
    assert load_text(str(path)) == "héllo\nworld\n"


def test_load_folder(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "notes.md").write_text("ignored")
    assert load_text(str(tmp_path)) == "first\nsecond"


def test_load_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [{"text": "one", "id": 1}, {"text": "two\nlines", "id": 2}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_text(str(path)) == "one\ntwo\nlines"
    path.write_text("\ufeff" + json.dumps({"body": "x\u2028y"}, ensure_ascii=False) + "\r\n")
    assert load_text(str(path), column="body") == "x\u2028y"


def test_load_parquet(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["alpha", None, "beta"], "n": [1, 2, 3]}), path)
    assert load_text(str(path)) == "alpha\nbeta"


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _folder_without_txt(path: Path) -> Path:
    (path / "sub").mkdir()
    (path / "sub" / "a.md").write_text("text")
    return path


def _parquet(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path / "d.parquet")
    return path / "d.parquet"


BAD_INPUTS = {
    "no such file or folder": lambda p: p / "missing.txt",
    "empty (no text but whitespace)": lambda p: _write(p / "empty.txt", b" \n\t"),
    "latin1.txt is not UTF-8 (byte 0xe9 at offset 3)": lambda p: _write(
        p / "latin1.txt", "café".encode("latin-1")
    ),
    "has no .txt files": _folder_without_txt,
    "line 1 has no column 'text' (columns: body)": lambda p: _write(
        p / "d.jsonl", b'{"body": "x"}\n'
    ),
    "line 2 is not valid JSON": lambda p: _write(p / "d.jsonl", b'{"text": "x"}\n{bad\n'),
    "column 'text' of": lambda p: _write(p / "d.jsonl", b'{"text": " "}\n'),
    "is not a string": lambda p: _write(p / "d.jsonl", b'{"text": 3}\n'),
    "has no column 'text' (columns: body, n)": lambda p: _parquet(p, {"body": ["x"], "n": [1]}),
    "holds int64, not strings": lambda p: _parquet(p, {"text": [1, 2]}),
    "is not a readable Parquet file": lambda p: _write(p / "bad.parquet", b"not parquet"),
}


@pytest.mark.parametrize("message", BAD_INPUTS)
def test_load_errors(tmp_path: Path, message: str) -> None:
    path = BAD_INPUTS[message](tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_text(str(path))
    assert str(info.value).startswith("--corpus: ") and "\n" not in str(info.value)


def test_not_utf8_names_the_file_in_a_folder(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("fine")
    _write(tmp_path / "bad.txt", b"ok \xff")
    with pytest.raises(ConfigError, match=r"bad\.txt is not UTF-8 \(byte 0xff at offset 3\)"):
        load_text(str(tmp_path))


def test_hf_source_without_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match="needs the Hugging Face `datasets` library"):
        load_text("hf:some/name")
    with pytest.raises(ConfigError, match="name a dataset"):
        load_text("hf:")


def test_hf_source_reads_the_named_split_and_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub is out of reach here: a stand-in ``datasets`` module records what is asked."""
    calls = []

    class Dataset:
        column_names = ("text", "label")

        def __getitem__(self, column: str) -> list:
            return {"text": ["first", None, "second"], "label": [0, 1, 2]}[column]

    def load_dataset(name: str, split: str) -> Dataset:
        calls.append((name, split))
        if name == "offline/name":
            raise ConnectionError("Couldn't reach the hub\nmore detail")
        return Dataset()

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=load_dataset))
    assert load_text("hf:user/data") == "first\nsecond"
    assert load_text("hf:user/data:validation") == "first\nsecond"
    assert load_text("hf:user/data:train+validation") == "first\nsecond"  # not a join of names
    assert calls == [
        ("user/data", "train"),
        ("user/data", "validation"),
        ("user/data", "train+validation"),
    ]
    with pytest.raises(ConfigError, match=r"has no column 'body' \(columns: text, label\)"):
        load_text("hf:user/data", column="body")
    with pytest.raises(ConfigError, match=r"\(offline\?\): Couldn't reach the hub$"):
        load_text("hf:offline/name")


def test_split_text() -> None:
    text = "abcdefghij" * 100
    train, val = split_text(text, 0.05)
    assert len(train) == 950 and len(val) == 50 and train + val == text
    assert split_text("abc", 0.01) == ("ab", "c")
    # the share is of UTF-8 bytes (95 + 2 x 3 bytes: the last 5), and a character is never cut:
    # byte 96 is inside the first €, so the split moves to its start
    assert split_text("a" * 95 + "€€", 0.05) == ("a" * 95, "€€")
    assert split_text("a" * 95 + "€€", 0.03) == ("a" * 95 + "€", "€")
    assert split_text("€a", 0.9) == ("€", "a")  # the first character stays in training
    with pytest.raises(ConfigError, match="val_fraction"):
        split_text(text, 1.0)
    with pytest.raises(ConfigError, match="at least 2"):
        split_text("a", 0.5)


def test_a_bpe_never_sees_the_held_out_text(tmp_path: Path) -> None:
    """A word that only the held-out tail holds, repeated there many times, would become one BPE
    token if the tokenizer were trained on the whole text."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), 4)) for _ in range(3000)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(words) + " zyxwvutsrq" * 400)
    source = TextSource(
        CorpusConfig(source=str(corpus), tokenizer="bpe", bpe_vocab=300, val_fraction=0.3),
        eval_tokens=64,
    )
    assert "zyxwvutsrq" in source.tokenizer.decode(source.stream.val.numpy())
    assert len(source.tokenizer.encode(" zyxwvutsrq")) > 2  # no merges learned from it
    leaky = get_tokenizer("bpe", corpus.read_text(), 300, tmp_path / "leaky")
    assert len(leaky.encode(" zyxwvutsrq")) <= 2  # what training on the whole text would learn


@pytest.fixture
def stream() -> TokenStream:
    ids = np.random.default_rng(0).integers(0, 500, 2000).astype(np.uint16)
    return TokenStream(ids[:1800], ids[1800:])


def test_batch_windows(stream: TokenStream) -> None:
    x, y = stream.batch("train", 8, 32, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    ids = stream.train
    for row_x, row_y in zip(x, y, strict=True):
        starts = [s for s in range(len(ids) - 32) if torch.equal(ids[s : s + 32], row_x)]
        assert any(torch.equal(ids[s + 1 : s + 33], row_y) for s in starts)


def test_batch_deterministic(stream: TokenStream) -> None:
    a = stream.batch("val", 4, 16, torch.Generator().manual_seed(3))
    b = stream.batch("val", 4, 16, torch.Generator().manual_seed(3))
    c = stream.batch("val", 4, 16, torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_batch_reaches_the_last_token() -> None:
    s = TokenStream(np.arange(5), np.arange(3))
    x, y = s.batch("train", 64, 4, torch.Generator().manual_seed(0))
    assert torch.equal(x, torch.arange(4).expand(64, 4))
    assert torch.equal(y, torch.arange(1, 5).expand(64, 4))


def test_eval_windows(stream: TokenStream) -> None:
    windows = list(stream.eval_windows("val", 30, 100))
    assert len(windows) == (len(stream.val) - 1) // 30
    xs = torch.cat([x for x, _ in windows])
    assert torch.equal(xs, stream.val[: len(xs)])
    for x, y in windows:
        assert x.shape == y.shape == (30,)
        assert torch.equal(x[1:], y[:-1])
    assert torch.equal(windows[-1][1][-1], stream.val[len(xs)])
    again = list(stream.eval_windows("val", 30, 3))
    assert len(again) == 3
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, windows, strict=False))


def test_seq_len_and_split_errors(stream: TokenStream) -> None:
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ConfigError, match=r"seq_len: must be in \[1, 199\] for the val split"):
        stream.batch("val", 2, 200, gen)
    with pytest.raises(ConfigError, match="seq_len"):
        list(stream.eval_windows("train", 5000, 1))
    with pytest.raises(ConfigError, match="split: unknown value 'test'"):
        stream.batch("test", 2, 8, gen)


class _Uniform(torch.nn.Module):
    """Equal logits over the vocabulary: a loss of log V nats per token."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*idx.shape, self.vocab)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_loss_per_byte_divides_by_the_text_bytes_scored(tmp_path: Path, kind: str) -> None:
    corpus = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text(" ".join("".join(rng.choice(list("abcdéfgh"), 4)) for _ in range(3000)))
    cfg = CorpusConfig(source=str(corpus), tokenizer=kind, bpe_vocab=300, val_fraction=0.3)
    source = TextSource(cfg, eval_tokens=1024)  # 32 windows of 32: two evaluation batches
    metrics = source.evaluate(
        _Uniform(source.vocab_size), 32, True, torch.device("cpu"), contextlib.nullcontext
    )
    assert metrics["loss"] == pytest.approx(math.log(source.vocab_size))
    if kind == "byte":  # a byte is a token: nothing to convert
        assert not any("per_byte" in name for name in metrics)
        return
    assert {"loss_per_byte_2x", "loss_per_byte_4x"} <= set(metrics)
    targets = torch.cat([y for _, y in source.stream.eval_windows("val", 32, 1024 // 32)])
    scored = len(source.tokenizer.decode(targets.numpy()).encode())
    assert metrics["loss_per_byte"] == pytest.approx(
        math.log(source.vocab_size) * len(targets) / scored
    )
    assert metrics["loss_per_byte"] < metrics["loss"]  # a merged token holds several bytes
