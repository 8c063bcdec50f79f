"""Text corpora for language modelling: loading, splitting and batching token ids.

Two public-domain English corpora ship compressed with the package (``data/LICENSE-corpus.md``)
and are loaded by name: ``default``, the World English Bible (≈4.96 MB, one verse per line), and
``sotu``, the State of the Union addresses 1790–2021 (≈10.8 MB, one address per line). Names
joined by ``+`` concatenate corpora in that order, so the held-out tail comes from the last.
"""

from __future__ import annotations

import functools
import json
import lzma
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nopelab.config import CORPUS_NAMES, embedded_names
from nopelab.config import EMBEDDED_CORPORA as EMBEDDED
from nopelab.errors import ConfigError, first_line

FIELD = "--corpus"
SPLITS = ("train", "val")


SOURCES = (
    f"{CORPUS_NAMES}, names joined by +; a text file or a folder of .txt files; a .jsonl or "
    ".parquet file; hf:NAME[:SPLIT]"
)


@functools.lru_cache(maxsize=len(EMBEDDED))
def embedded_corpus(name: str) -> str:
    """An embedded corpus (a key of :data:`EMBEDDED`) as one string."""
    data = resources.files("nopelab").joinpath("data", EMBEDDED[name][0]).read_bytes()
    return lzma.decompress(data).decode("utf-8")


def describe(source: str) -> str:
    """What a corpus source holds, for summaries: ``"the embedded World English Bible"``, ..."""
    names = embedded_names(source)
    if names is None:
        return source
    return " followed by ".join(f"the embedded {EMBEDDED[name][1]}" for name in names)


def load_text(source: str, column: str = "text") -> str:
    """The text of a corpus source.

    ``source`` is an embedded corpus's name (``"default"``, ``"sotu"``) or names joined by
    ``+`` (``"sotu+default"``: both, in that order); a text file; a folder (its ``*.txt``
    files, recursively, in path order); a ``.jsonl`` or ``.parquet`` file (the string
    ``column``); or ``hf:NAME[:SPLIT]``, a Hugging Face dataset (needs ``datasets``). Documents
    are joined with newlines. Bad input raises a one-line :class:`ConfigError` for ``--corpus``.
    """
    names = embedded_names(source)
    if names is not None:
        return embedded_corpus(names[0]) if len(names) == 1 else _joined(names)
    if source.startswith("hf:"):
        return _nonempty(_load_hf(source, column), source)
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(
            FIELD,
            f"no such file or folder: {source} (allowed: {SOURCES})",
        )
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise ConfigError(FIELD, f"folder {source} has no .txt files")
        return _nonempty("\n".join(_read_utf8(p) for p in files), source)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _nonempty(_load_jsonl(path, column), f"column {column!r} of {source}")
    if suffix == ".parquet":
        return _nonempty(_load_parquet(path, column), f"column {column!r} of {source}")
    return _nonempty(_read_utf8(path), source)


def _joined(names: list[str]) -> str:
    """Embedded corpora one after another, each ending in a newline."""
    parts = (embedded_corpus(name) for name in names)
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


def _nonempty(text: str, what: str) -> str:
    if not text.strip():
        raise ConfigError(FIELD, f"{what} is empty (no text but whitespace)")
    return text


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise ConfigError(
            FIELD, f"{path} is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def _load_jsonl(path: Path, column: str) -> str:
    texts = []
    for number, line in enumerate(_read_utf8(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(FIELD, f"{path} line {number} is not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise ConfigError(FIELD, f"{path} line {number} is not a JSON object")
        if column not in record:
            columns = ", ".join(record) or "none"
            raise ConfigError(
                FIELD, f"{path} line {number} has no column {column!r} (columns: {columns})"
            )
        value = record[column]
        if not isinstance(value, str):
            raise ConfigError(
                FIELD, f"{path} line {number}: column {column!r} is not a string: {value!r:.40}"
            )
        texts.append(value)
    return "\n".join(texts)


def _load_parquet(path: Path, column: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(FIELD, f"{path} is not a readable Parquet file ({e})") from None
    if column not in schema.names:
        raise ConfigError(
            FIELD, f"{path} has no column {column!r} (columns: {', '.join(schema.names)})"
        )
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(FIELD, f"column {column!r} of {path} holds {kind}, not strings")
    values = pq.read_table(path, columns=[column]).column(column).drop_null()
    return "\n".join(values.to_pylist())


def _load_hf(source: str, column: str) -> str:
    name, _, split = source.removeprefix("hf:").partition(":")
    if not name:
        raise ConfigError(FIELD, f"{source!r}: name a dataset, e.g. hf:NAME or hf:NAME:SPLIT")
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            FIELD, f"{source} needs the Hugging Face `datasets` library: pip install datasets"
        ) from None
    try:
        dataset = datasets.load_dataset(name, split=split or "train")
    except Exception as e:  # offline, unknown name or split: datasets raises many kinds
        message = first_line(e)
        raise ConfigError(
            FIELD, f"cannot load {source} from the Hugging Face hub (offline?): {message}"
        ) from None
    if column not in dataset.column_names:
        columns = ", ".join(dataset.column_names)
        raise ConfigError(FIELD, f"{source} has no column {column!r} (columns: {columns})")
    return "\n".join(t for t in dataset[column] if isinstance(t, str))


def split_text(text: str, val_fraction: float = 0.05) -> tuple[str, str]:
    """(train, val): the contiguous tail, a ``val_fraction`` share of the UTF-8 bytes (at least
    one character), is val. Split before tokenising, so that a tokenizer is trained on the
    training text alone."""
    if not 0 < val_fraction < 1:
        raise ConfigError("val_fraction", f"must be in (0, 1), got {val_fraction!r}")
    data = text.encode("utf-8")
    if len(text) < 2:
        raise ConfigError(FIELD, f"the corpus has {len(text)} characters; need at least 2")
    cut = len(data) - min(max(round(len(data) * val_fraction), 1), len(data) - 1)
    while cut > 0 and data[cut] & 0xC0 == 0x80:  # inside a character: split before it
        cut -= 1
    cut = cut or len(text[0].encode("utf-8"))  # the first character stays in training
    return data[:cut].decode("utf-8"), data[cut:].decode("utf-8")


class TokenStream:
    """Token ids of a corpus, split into train and validation, with random windows for training.

    ``train`` and ``val`` are 1-D int64 CPU tensors.
    """

    def __init__(self, train: np.ndarray, val: np.ndarray):
        self.train = torch.from_numpy(np.asarray(train, dtype=np.int64))
        self.val = torch.from_numpy(np.asarray(val, dtype=np.int64))

    def _ids(self, split: str, seq_len: int) -> Tensor:
        if split not in SPLITS:
            raise ConfigError("split", f"unknown value {split!r}; allowed: {', '.join(SPLITS)}")
        ids = self.train if split == "train" else self.val
        if seq_len < 1 or len(ids) < seq_len + 1:
            raise ConfigError(
                "seq_len",
                f"must be in [1, {len(ids) - 1}] for the {split} split ({len(ids)} tokens), got {seq_len}",
            )
        return ids

    def batch(
        self, split: str, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """(x, y), each (batch_size, seq_len) int64: random windows and the next tokens."""
        ids = self._ids(split, seq_len)
        starts = torch.randint(0, len(ids) - seq_len, (batch_size, 1), generator=generator)
        windows = ids[starts + torch.arange(seq_len + 1)]
        return windows[:, :-1], windows[:, 1:]

    def eval_windows(
        self, split: str, seq_len: int, max_windows: int
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Consecutive non-overlapping windows (x, y), each (seq_len,), from the split's start.

        At most ``max_windows`` windows; ``y`` is ``x`` shifted by one token.
        """
        ids = self._ids(split, seq_len)
        for i in range(min(max_windows, (len(ids) - 1) // seq_len)):
            start = i * seq_len
            yield ids[start : start + seq_len], ids[start + 1 : start + seq_len + 1]
