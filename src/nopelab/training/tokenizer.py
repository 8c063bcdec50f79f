"""Tokenizers for text corpora: raw UTF-8 bytes, or a byte-level BPE trained locally.

Both are lossless: ``decode(encode(s)) == s`` for every Unicode string ``s``. A trained BPE
is cached as JSON (keyed by a hash of the text, the vocabulary size and the ``tokenizers``
version) so that a corpus is trained on once.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from nopelab.errors import ConfigError
from nopelab.limits import check_tokenizer
from nopelab.runtime.rundir import replace_atomically

KINDS = ("byte", "bpe")
CHUNK_CHARS = 1 << 16  # texts are trained on and encoded in chunks of about this many characters
_RECIPE = "bpe-bytelevel-v1"  # part of the cache key: change it when the training recipe changes


class Tokenizer(Protocol):
    """Text to token ids and back."""

    vocab_size: int

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (uint16 or int32)."""

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of token ids."""

    def token_bytes(self) -> np.ndarray:
        """The length in UTF-8 bytes of each token id: int64, shape (vocab_size,)."""

    def to_json(self) -> str:
        """A JSON description that :func:`tokenizer_from_json` turns back into this tokenizer."""


def _id_dtype(vocab_size: int) -> type[np.integer]:
    return np.uint16 if vocab_size <= 1 << 16 else np.int32


class ByteTokenizer:
    """One token per UTF-8 byte."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        array = np.asarray(ids, dtype=np.int64).ravel()
        if array.size and (array.min() < 0 or array.max() > 255):
            raise ValueError("byte token ids must be in [0, 255]")
        return array.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        return np.ones(self.vocab_size, dtype=np.int64)

    def to_json(self) -> str:
        return json.dumps({"kind": "byte"})


class BPETokenizer:
    """A byte-level BPE (GPT-2 style pre-tokenisation, no normaliser) from ``tokenizers``."""

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """Train on ``text`` up to ``vocab_size`` tokens (the 256 bytes included)."""
        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(_chunks(text), trainer=trainer)
        return cls(tokenizer)

    def encode(self, text: str) -> np.ndarray:
        dtype = _id_dtype(self.vocab_size)
        encodings = self.tokenizer.encode_batch_fast(list(_chunks(text)), add_special_tokens=False)
        return np.concatenate([np.zeros(0, dtype)] + [np.array(e.ids, dtype) for e in encodings])

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode(np.asarray(ids).ravel().tolist(), skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        # The byte-level alphabet spells every byte as one character (nopelab's BPEs have no
        # added tokens, which would not be spelled that way).
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for token, index in self.tokenizer.get_vocab().items():
            lengths[index] = len(token)
        return lengths

    def to_json(self) -> str:
        return self.tokenizer.to_str()


def _chunks(text: str) -> Iterator[str]:
    """Consecutive pieces of ``text`` of about CHUNK_CHARS characters.

    A piece ends after a newline where there is one, else before a space, so that few
    pre-tokens are cut; the pieces concatenate to ``text``.
    """
    start = 0
    while start < len(text):
        end = start + CHUNK_CHARS
        if end < len(text):
            newline = text.rfind("\n", start, end)
            space = text.rfind(" ", start + 1, end)
            end = newline + 1 if newline >= 0 else space if space >= 0 else end
        yield text[start:end]
        start = end


def tokenizer_from_json(text: str) -> Tokenizer:
    """The tokenizer that ``to_json`` described (a byte tokenizer or a BPE)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError("tokenizer", f"tokenizer JSON is not valid JSON ({e.msg})") from None
    if isinstance(data, dict) and data.get("kind") == "byte":
        return ByteTokenizer()
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        return BPETokenizer(tokenizers.Tokenizer.from_str(text))
    raise ConfigError("tokenizer", "tokenizer JSON describes neither a byte tokenizer nor a BPE")


def default_cache_dir() -> Path:
    """``$NOPELAB_CACHE``, else ``~/.cache/nopelab``."""
    return Path(os.environ.get("NOPELAB_CACHE") or Path.home() / ".cache" / "nopelab")


def get_tokenizer(
    kind: str, text: str, vocab_size: int = 4096, cache_dir: Path | None = None
) -> Tokenizer:
    """A ``byte`` tokenizer, or a ``bpe`` of ``vocab_size`` tokens trained on ``text``.

    A BPE is reused from ``cache_dir`` (default :func:`default_cache_dir`) when one was
    trained on the same text and size; a new one (or one for a damaged entry) is written there
    atomically.
    """
    if kind not in KINDS:
        raise ConfigError("tokenizer", f"unknown value {kind!r}; allowed: {', '.join(KINDS)}")
    if kind == "byte":
        return ByteTokenizer()
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 256:
        raise ConfigError("bpe_vocab", f"must be an int > 256 for a BPE, got {vocab_size!r}")
    key = hashlib.sha256(
        f"{_RECIPE}\0{vocab_size}\0{tokenizers.__version__}\0".encode() + text.encode("utf-8")
    ).hexdigest()[:32]
    path = (cache_dir or default_cache_dir()) / "tokenizers" / f"bpe-{vocab_size}-{key}.json"
    cached = _cached(path, vocab_size)
    if cached is not None:
        return cached
    check_tokenizer(len(text.encode("utf-8")), vocab_size)
    tokenizer = BPETokenizer.train(text, vocab_size)
    if tokenizer.vocab_size < vocab_size:
        raise ConfigError(
            "bpe_vocab",
            f"the corpus yields only {tokenizer.vocab_size} BPE tokens; ask for at most that many",
        )
    _write_atomic(path, tokenizer.to_json())
    return tokenizer


def _cached(path: Path, vocab_size: int) -> BPETokenizer | None:
    """The BPE cached at ``path``; None where there is none or the file is damaged (truncated,
    not UTF-8, not a BPE of that size), which is then trained again and written over it."""
    try:
        cached = tokenizer_from_json(path.read_text(encoding="utf-8"))
    except Exception:  # none yet, or whatever a damaged file makes the parsers raise
        return None
    if isinstance(cached, BPETokenizer) and cached.vocab_size == vocab_size:
        return cached
    return None


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except OSError as e:
        warnings.warn(f"cannot cache the BPE tokenizer in {path.parent}: {e}", stacklevel=3)
