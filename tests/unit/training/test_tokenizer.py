"""Byte and BPE tokenizers: lossless round trips, JSON round trips and the BPE cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nopelab.errors import ConfigError
from nopelab.training import tokenizer as tok
from nopelab.training.corpus import embedded_corpus
from nopelab.training.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    get_tokenizer,
    tokenizer_from_json,
)

SAMPLE = "naïve café — “quoted” 日本語 🙂\n\tline two\r\n  spaces  end \x00"


@pytest.fixture(scope="module")
def train_text() -> str:
    return embedded_corpus("default")[:100_000]


@pytest.fixture(scope="module")
def bpe(train_text: str) -> BPETokenizer:
    return BPETokenizer.train(train_text, 400)


def test_byte_encode_is_utf8_bytes() -> None:
    ids = ByteTokenizer().encode(SAMPLE)
    assert ids.dtype == np.uint16
    assert bytes(ids.astype(np.uint8)) == SAMPLE.encode("utf-8")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_round_trip(text: str) -> None:
    t = ByteTokenizer()
    assert t.decode(t.encode(text)) == text


def test_byte_decode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="0, 255"):
        ByteTokenizer().decode([65, 256])


def test_bpe_trained_size_and_compression(bpe: BPETokenizer, train_text: str) -> None:
    assert bpe.vocab_size == 400
    ids = bpe.encode(train_text)
    assert ids.dtype == np.uint16 and ids.max() < 400
    assert len(ids) < 0.5 * len(train_text.encode("utf-8"))
    assert bpe.decode(ids) == train_text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_bpe_round_trip(bpe: BPETokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


def test_bpe_round_trip_across_chunks(bpe: BPETokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tok, "CHUNK_CHARS", 7)
    text = SAMPLE * 5 + "x" * 30
    assert "".join(tok._chunks(text)) == text
    assert bpe.decode(bpe.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_token_bytes_add_up_to_the_utf8_length(bpe: BPETokenizer, text: str) -> None:
    for tokenizer in (bpe, ByteTokenizer()):
        lengths = tokenizer.token_bytes()
        assert lengths.shape == (tokenizer.vocab_size,) and lengths.min() >= 1
        assert int(lengths[tokenizer.encode(text).astype(np.int64)].sum()) == len(text.encode())


def test_token_bytes_match_each_whole_token(bpe: BPETokenizer) -> None:
    """A merged token that decodes to whole characters has their UTF-8 length."""
    pieces = {i: bpe.decode([i]) for i in range(256, bpe.vocab_size)}
    whole = {i: s for i, s in pieces.items() if "\ufffd" not in s}
    assert len(whole) > 100
    assert all(bpe.token_bytes()[i] == len(s.encode()) for i, s in whole.items())


def test_decode_accepts_tensors(bpe: BPETokenizer) -> None:
    torch = pytest.importorskip("torch")
    ids = bpe.encode(SAMPLE)
    assert bpe.decode(torch.from_numpy(ids.astype(np.int64))) == SAMPLE


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_json_round_trip(kind: str, bpe: BPETokenizer) -> None:
    original = ByteTokenizer() if kind == "byte" else bpe
    restored = tokenizer_from_json(original.to_json())
    assert type(restored) is type(original)
    assert restored.vocab_size == original.vocab_size
    np.testing.assert_array_equal(restored.encode(SAMPLE), original.encode(SAMPLE))


def test_from_json_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        tokenizer_from_json("{nope")
    with pytest.raises(ConfigError, match="neither"):
        tokenizer_from_json(json.dumps({"kind": "words"}))


def test_get_tokenizer_byte_and_bad_kind(tmp_path) -> None:
    assert isinstance(get_tokenizer("byte", "abc", cache_dir=tmp_path), ByteTokenizer)
    with pytest.raises(ConfigError, match="tokenizer: unknown value 'word'"):
        get_tokenizer("word", "abc", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="bpe_vocab: must be an int > 256"):
        get_tokenizer("bpe", "abc", vocab_size=256, cache_dir=tmp_path)


def test_bpe_cache_reused(
    train_text: str, tmp_path, monkeypatch: pytest.MonkeyPatch, bpe: BPETokenizer
) -> None:
    first = get_tokenizer("bpe", train_text, vocab_size=400, cache_dir=tmp_path)
    (cached,) = (tmp_path / "tokenizers").glob("bpe-400-*.json")
    assert not list((tmp_path / "tokenizers").glob("*.tmp"))

    def no_training(cls, text: str, vocab_size: int) -> BPETokenizer:
        raise AssertionError("retrained although a cached tokenizer exists")

    monkeypatch.setattr(BPETokenizer, "train", classmethod(no_training))
    second = get_tokenizer("bpe", train_text, vocab_size=400, cache_dir=tmp_path)
    np.testing.assert_array_equal(second.encode(SAMPLE), first.encode(SAMPLE))
    np.testing.assert_array_equal(second.encode(SAMPLE), bpe.encode(SAMPLE))
    # Another text or size is another cache entry, so it would have to be trained.
    with pytest.raises(AssertionError, match="retrained"):
        get_tokenizer("bpe", train_text + "!", vocab_size=400, cache_dir=tmp_path)
    with pytest.raises(AssertionError, match="retrained"):
        get_tokenizer("bpe", train_text, vocab_size=401, cache_dir=tmp_path)
    assert cached.is_file()


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"\xff\xfe" + data[2:],  # not UTF-8
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: b'{"kind": "byte"}',  # another tokenizer
    ],
    ids=["not-utf8", "truncated", "not-this-bpe"],
)
def test_a_damaged_bpe_cache_entry_is_trained_again_and_replaced(
    damage, tmp_path, train_text: str
) -> None:
    """The cache is nopelab's own: a damaged entry is rebuilt (atomically), not an error."""
    text = train_text[:20_000]
    first = get_tokenizer("bpe", text, vocab_size=300, cache_dir=tmp_path)
    (cached,) = (tmp_path / "tokenizers").glob("bpe-300-*.json")
    intact = cached.read_bytes()
    cached.write_bytes(damage(intact))
    again = get_tokenizer("bpe", text, vocab_size=300, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.encode(SAMPLE), first.encode(SAMPLE))
    assert cached.read_bytes() == intact
    assert sorted(p.name for p in (tmp_path / "tokenizers").iterdir()) == [cached.name]


def test_bpe_cache_dir_from_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOPELAB_CACHE", str(tmp_path))
    get_tokenizer("bpe", "the cat sat on the mat " * 50, vocab_size=260)
    assert len(list((tmp_path / "tokenizers").glob("bpe-260-*.json"))) == 1


def test_bpe_too_small_corpus(tmp_path) -> None:
    # "abc abc": merges a+b, ab+c and the space's; 7 bytes could allow at most 256 + 7 tokens
    with pytest.raises(ConfigError, match="bpe_vocab: the corpus yields only 259 BPE tokens"):
        get_tokenizer("bpe", "abc abc", vocab_size=260, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="bpe_vocab: a corpus of 7 bytes yields at most 263"):
        get_tokenizer("bpe", "abc abc", vocab_size=4096, cache_dir=tmp_path)  # before training
    assert not (tmp_path / "tokenizers").exists()
