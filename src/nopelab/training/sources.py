"""Training data behind one interface: a synthetic task or a text corpus.

A source gives training batches for a step (from a generator seeded by the step, so a resumed
run sees the same batches), input ids for analysing a trained model on held-out data, and
its own evaluation: exact-match accuracy for a task, loss and perplexity for text.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nopelab.config import CorpusConfig, ModelConfig, embedded_names
from nopelab.encodings import encoding
from nopelab.errors import ConfigError
from nopelab.training import tasks
from nopelab.training.corpus import TokenStream, load_text, split_text
from nopelab.training.task_config import (
    VOCAB,
    TaskConfig,
    check_seq_len,
    max_line_len,
    max_prompt_len,
)
from nopelab.training.tokenizer import Tokenizer, get_tokenizer, tokenizer_from_json

IGNORE = tasks.IGNORE  # targets without loss
EVAL_BATCH = 16  # held-out windows per forward pass
Autocast = Callable[[], AbstractContextManager[Any]]  # a fresh autocast context per forward pass


class Source(Protocol):
    vocab_size: int
    fingerprint: str  # sha256 of the data, recorded with a run and checked when it resumes

    def batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """(idx, targets), each (B, T) int64 on the CPU; targets are -100 where no loss is taken."""

    def held_out(self, batch_size: int, seq_len: int, generator: torch.Generator) -> Tensor:
        """(B, T) token ids from data the model was not trained on."""

    def evaluate(
        self, model: nn.Module, seq_len: int, final: bool, device: torch.device, autocast: Autocast
    ) -> dict[str, float]:
        """Held-out metrics; ``final`` asks for the complete evaluation."""


def token_loss(
    model: nn.Module, idx: Tensor, targets: Tensor, autocast: Autocast
) -> tuple[float, int]:
    """Summed cross-entropy over the non-ignored targets, and their count."""
    with autocast():
        logits = model(idx)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum"
    )
    return float(loss), int((targets != IGNORE).sum())


class TaskSource:
    """A synthetic task: training rows in the task's layout, exact-match accuracy on the
    disjoint test set (prompts left-padded as in training for the ``padded`` layout)."""

    vocab_size = len(VOCAB)

    def __init__(self, cfg: TaskConfig, seed: int, eval_samples: int):
        self.cfg = cfg
        self.train, self.test = tasks.make_splits(cfg, seed)
        digest = hashlib.sha256()
        for split in (self.train, self.test):
            digest.update("".join(example.text for example in split).encode() + b"\0")
        self.fingerprint = digest.hexdigest()
        self.eval_samples = eval_samples
        self.prompt_len = max_prompt_len(cfg)
        self.pad_to = self.prompt_len if cfg.layout == "padded" else None
        width = max_line_len(cfg)
        self.rows = {
            "train": self._rows(self.train, seed, width),
            "test": self._rows(self.test, seed, width),
        }

    def _rows(
        self, examples: list[tasks.Example], seed: int, width: int
    ) -> tasks.LineStream | tasks.PaddedLines | None:
        if self.cfg.layout == "windows":
            return tasks.LineStream(examples, seed)
        if self.cfg.layout == "padded":
            return tasks.PaddedLines(examples, self.prompt_len, width)
        return None  # packed rows are drawn from the lines themselves

    def check_model(self, model: ModelConfig, seq_len: int) -> None:
        if model.vocab_size != self.vocab_size:
            raise ConfigError(
                "vocab_size",
                f"tasks use a {self.vocab_size}-character vocabulary, got {model.vocab_size}",
            )
        check_seq_len(self.cfg, seq_len)
        if encoding(model.pos_encoding).table and seq_len > model.max_seq_len:
            raise ConfigError(
                "max_seq_len",
                f"the learned position table must cover the training context of {seq_len} "
                f"tokens (--seq-len); allowed: >= {seq_len}, got {model.max_seq_len}",
            )
        for split, rows in self.rows.items():  # windows need that many characters of lines
            if isinstance(rows, tasks.LineStream) and len(rows.tokens) < seq_len + 1:
                raise ConfigError(
                    "seq_len",
                    f"{seq_len} is longer than all {split} lines together ({len(rows.tokens)} "
                    "characters); use more lines or a shorter seq_len",
                )

    def _batch(
        self, split: str, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        rows = self.rows[split]
        if rows is None:
            examples = self.train if split == "train" else self.test
            return tasks.packed_batch(examples, batch_size, seq_len, generator, self.cfg.loss_mode)
        return rows.batch(batch_size, seq_len, generator, self.cfg.loss_mode)

    def batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        return self._batch("train", batch_size, seq_len, generator)

    def held_out(self, batch_size: int, seq_len: int, generator: torch.Generator) -> Tensor:
        return tasks.packed_batch(self.test, batch_size, seq_len, generator)[0]

    def prompts(self, count: int, seq_len: int, generator: torch.Generator) -> Tensor:
        """Zuo et al.'s analysis inputs: ``count`` test prompts, one per sequence, left-padded
        with newlines to ``seq_len`` (drawn without replacement while the test set lasts)."""
        if seq_len < self.prompt_len:
            raise ConfigError(
                "seq_len",
                f"{seq_len} is shorter than the longest {self.cfg.name} prompt "
                f"({self.prompt_len} characters); allowed: >= {self.prompt_len}",
            )
        order = torch.cat(
            [
                torch.randperm(len(self.test), generator=generator)
                for _ in range(-(-count // len(self.test)))
            ]
        )[:count]
        text = "".join(tasks.left_pad(self.test[i].prompt, seq_len) for i in order.tolist())
        return torch.tensor(tasks.encode(text)).view(count, seq_len)

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, seq_len: int, final: bool, device: torch.device, autocast: Autocast
    ) -> dict[str, float]:
        examples = self.test if final else self.test[: self.eval_samples]
        generator = torch.Generator().manual_seed(0)
        total, count = 0.0, 0
        for _ in range(4):
            idx, targets = self._batch("test", 32, seq_len, generator)
            loss, n = token_loss(model, idx.to(device), targets.to(device), autocast)
            total, count = total + loss, count + n
        with autocast():
            acc = tasks.accuracy(model, examples, pad_to=self.pad_to, device=device)
        return {"accuracy": acc, "loss": total / max(count, 1)}


def mask_tokens(
    x: Tensor, rate: float, mask_id: int, vocab: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """A masked LM's (input, targets) from token windows ``x`` (B, T), as BERT: each token is
    hidden with probability ``rate``; a hidden one becomes ``mask_id`` (80 %), a random token of
    ``0..vocab-1`` (10 %) or stays (10 %), and is the only kind of position with a target (the
    original token; every other target is ignored). A window with no hidden token gets one, at
    a random position, so that no batch is without a loss."""
    hidden = torch.rand(x.shape, generator=generator) < rate
    one = torch.randint(0, x.shape[-1], x.shape[:-1], generator=generator)  # for a window with none
    none = ~hidden.any(-1)
    hidden[none, one[none]] = True
    draw = torch.rand(x.shape, generator=generator)
    random = torch.randint(0, vocab, x.shape, generator=generator)
    idx = torch.where(hidden & (draw < 0.8), mask_id, x)
    idx = torch.where(hidden & (draw >= 0.8) & (draw < 0.9), random, idx)
    return idx, torch.where(hidden, x, IGNORE)


class TextSource:
    """A text corpus: random training windows, loss and perplexity on the held-out tail; a
    causal LM predicts each next token, a masked LM (``objective = "masked"``) the hidden
    tokens of each window (its vocabulary gains the mask token, the last id)."""

    def __init__(self, cfg: CorpusConfig, eval_tokens: int, tokenizer: Tokenizer | None = None):
        self.cfg = cfg
        text = load_text(cfg.source, cfg.column)
        self.fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()
        train, val = split_text(text, cfg.val_fraction)
        self.tokenizer = tokenizer or get_tokenizer(  # trained on the training text alone
            cfg.tokenizer, train, cfg.bpe_vocab, bpe_cache_dir(cfg.source)
        )
        self.masked = cfg.objective == "masked"
        self.vocab_size = self.tokenizer.vocab_size + self.masked  # a masked LM's mask token
        self.stream = TokenStream(self.tokenizer.encode(train), self.tokenizer.encode(val))
        lengths = self.tokenizer.token_bytes()  # None below: one token per byte, nothing to convert
        self.token_bytes = torch.from_numpy(lengths) if (lengths != 1).any() else None
        self.eval_tokens = eval_tokens
        self.max_len: int | None = None  # longest evaluable context (learned position tables)

    def check_model(self, model: ModelConfig, seq_len: int) -> None:
        if model.vocab_size < self.vocab_size:
            mask = " and the mask token" if self.masked else ""
            raise ConfigError(
                "vocab_size",
                f"the {self.cfg.tokenizer} tokenizer{mask} take {self.vocab_size} ids; "
                f"got {model.vocab_size}",
            )
        if encoding(model.pos_encoding).table:
            if seq_len > model.max_seq_len:
                raise ConfigError(
                    "seq_len",
                    f"{seq_len} exceeds the learned position table (max_seq_len={model.max_seq_len})",
                )
            self.max_len = model.max_seq_len
        val = len(self.stream.val)
        if val < seq_len + 1:
            raise ConfigError(
                "seq_len",
                f"{seq_len} is longer than the held-out text ({val} tokens); use a bigger corpus",
            )

    def batch(
        self, batch_size: int, seq_len: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        x, y = self.stream.batch("train", batch_size, seq_len, generator)
        return self._pair(x, y, generator)

    def _pair(self, x: Tensor, y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """The model's input and targets for windows ``x`` and their next tokens ``y``."""
        if not self.masked:
            return x, y
        mask_id = self.tokenizer.vocab_size
        return mask_tokens(x, self.cfg.mask_rate, mask_id, mask_id, generator)

    def held_out(self, batch_size: int, seq_len: int, generator: torch.Generator) -> Tensor:
        return self.stream.batch("val", batch_size, seq_len, generator)[0]

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, seq_len: int, final: bool, device: torch.device, autocast: Autocast
    ) -> dict[str, float]:
        """Loss and perplexity on held-out windows of the training length, 2x and 4x it; with a
        BPE also the loss per byte of text (``loss_per_byte``, nats), comparable across
        vocabularies. A masked LM's are over its hidden tokens (the same ones at every
        evaluation: a fixed generator), each predicted from the rest of its window.

        Lengths that a learned position table cannot reach, or that the held-out text is too
        short for, are left out.
        """
        metrics = {}
        for factor in (1, 2, 4):
            length = factor * seq_len
            if (self.max_len and length > self.max_len) or len(self.stream.val) < length + 1:
                continue
            windows = max(1, self.eval_tokens // length)
            pairs = list(self.stream.eval_windows("val", length, windows))
            total, count, size = 0.0, 0, 0
            masks = torch.Generator().manual_seed(0)  # the same hidden tokens every time
            for start in range(0, len(pairs), EVAL_BATCH):
                inputs, following = zip(*pairs[start : start + EVAL_BATCH], strict=True)
                x, y = self._pair(torch.stack(inputs), torch.stack(following), masks)
                loss, n = token_loss(model, x.to(device), y.to(device), autocast)
                total, count = total + loss, count + n
                if self.token_bytes is not None:
                    size += int(self.token_bytes[y[y != IGNORE]].sum())
            suffix = "" if factor == 1 else f"_{factor}x"
            metrics[f"loss{suffix}"] = total / count
            metrics[f"perplexity{suffix}"] = math.exp(min(total / count, 700))
            if self.token_bytes is not None:
                metrics[f"loss_per_byte{suffix}"] = total / size
        return metrics

    def save_tokenizer(self, out: Path) -> None:
        (out / "tokenizer.json").write_text(self.tokenizer.to_json())


def bpe_cache_dir(source: str) -> Path | None:
    """Where a BPE trained on ``source`` is cached: ``.nopelab/`` next to a local corpus when
    that folder is writable, else (and for the embedded and Hugging Face corpora) the user cache."""
    if source.startswith("hf:") or embedded_names(source) is not None:
        return None
    path = Path(source).expanduser()
    folder = path if path.is_dir() else path.parent
    return folder / ".nopelab" if os.access(folder, os.W_OK) else None


def load_tokenizer(out: Path) -> Tokenizer | None:
    path = out / "tokenizer.json"
    return tokenizer_from_json(path.read_text()) if path.is_file() else None
