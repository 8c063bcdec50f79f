"""Validated configuration dataclasses: the one truth for settings.

Every field is checked when the object is built, so a bad value fails early with a
one-line :class:`~nopelab.errors.ConfigError` that names the field and what is allowed.
``Literal`` types are the choices; each field's ``help`` metadata (see :func:`setting`) is what
the command line shows, so the CLI's options, defaults, choices and help come from here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import operator
import re
import tomllib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

import yaml

from nopelab.encodings import ENCODINGS, NAMES, encoding
from nopelab.errors import ConfigError, first_line

if TYPE_CHECKING:
    PosEncoding = str  # one of nopelab.encodings.NAMES
else:
    PosEncoding = Literal[NAMES]  # the choices the command line and the checks see
Init = Literal[
    "normal", "gpt2", "xavier_normal", "xavier_uniform", "kaiming_uniform", "uniform", "pytorch"
]
Norm = Literal["layernorm", "rmsnorm"]
Mlp = Literal["gelu", "swiglu"]
NormPosition = Literal["pre", "post"]
Input = Literal["random", "tokens", "data", "prompts"]
Dtype = Literal["float32", "bfloat16", "float16"]
Site = Literal["embed", "attn_heads", "attn_out", "resid_mid", "mlp_out", "resid_post"]
AnalysisSite = Literal[Site, "attention"]  # attention: each layer's pattern, reduced per head
Precision = Literal["auto", "float32", "bfloat16"]
Tokenizer = Literal["byte", "bpe"]
Objective = Literal["next", "masked"]
Probe = Literal["linear-cls", "mlp-cls", "linear-reg", "mlp-reg"]
Target = Literal["position", "distance"]
Split = Literal["sequences", "vocab"]
Intervention = Literal["equalize-norm", "shuffle-norm", "leace", "leace-shuffled", "leace-rotated"]
Concept = Literal["onehot", "scalar"]

POS_ENCODINGS = get_args(PosEncoding)
INITS = get_args(Init)
NORMS = get_args(Norm)
MLPS = get_args(Mlp)
NORM_POSITIONS = get_args(NormPosition)
INPUTS = get_args(Input)
DTYPES = get_args(Dtype)
SITES = get_args(Site)  # model order
BLOCK_SITES = SITES[1:]
DEFAULT_SITES = tuple(site for site in SITES if site != "attn_heads")  # attn_heads on request
ATTENTION: Final = "attention"
PRECISIONS = get_args(Precision)
TOKENIZERS = get_args(Tokenizer)
PROBES = get_args(Probe)
TARGETS = get_args(Target)
SPLITS = get_args(Split)
INTERVENTIONS = get_args(Intervention)
CONCEPTS = get_args(Concept)
FEATURES = ("raw", "norm", "variance", "cos_last", "cos_row")

MAX_INT = 2**31 - 1  # counts, sizes and lengths
MAX_SEED = 2**63 - 1
MAX_BPE_VOCAB = 2**20


def setting(default: Any, help: str, *, flag: str | None = None, shown: str | None = None) -> Any:
    """A config field with its command-line face.

    ``help``: one sentence, without choices or default (both are added from the type and the
    default); ``flag``: the option's name when it is not ``--field-name`` (``"--layers"``), or a
    ``"--on/--off"`` pair for a bool; ``shown``: how help shows the default when the value alone
    would not say it (``"all"`` for an empty layer list).
    """
    return field(default=default, metadata={"help": help, "flag": flag, "shown": shown})


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, f"unknown value {value!r}; allowed: {', '.join(allowed)}")


def check_choices(name: str, values: tuple, allowed: tuple[str, ...]) -> None:
    """A non-empty list whose every item is one of ``allowed``."""
    if not values:
        raise ConfigError(name, f"needs at least one of: {', '.join(allowed)}")
    for value in values:
        check_choice(name, value, allowed)


def _layer_numbers(name: str, values: tuple) -> None:
    for layer in values:
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ConfigError(name, f"expected layer numbers >= 0, got {layer!r}")


def check_sections(data: dict[str, Any], allowed: tuple[str, ...], where: str = "config") -> None:
    """Refuse a table of a config file (or of a grid's base) that is not an ``allowed`` section."""
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(where, f"unknown section {unknown[0]!r}; allowed: {', '.join(allowed)}")


def first_difference(
    old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]], ignore: tuple[str, ...] = ()
) -> tuple[str, Any, Any] | None:
    """The first ``section.key`` (in sorted order, outside ``ignore``) whose value differs
    between two configs given section by section, with its old and new value."""
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key) and f"{section}.{key}" not in ignore:
                return f"{section}.{key}", a.get(key), b.get(key)
    return None


def check_seed(name: str, value: Any) -> int:
    """The one rule for seeds (every command's ``--seed``, a grid's ``seeds``): an int in
    0..:data:`MAX_SEED`; numpy's and torch's generators take no negative seed."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ConfigError(name, f"must be an int in 0..{MAX_SEED}, got {value!r}")
    return value


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(name, f"must be > 0, got {value!r}")


def _as_tuple(name: str, value: Any) -> tuple:
    """A list setting as a tuple; a bare string or scalar is a ConfigError (not a TypeError)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(name, f"expected a list, got {value!r}")
    return tuple(value)


def without_none(hint: Any) -> tuple[Any, bool]:
    """``X | None`` → ``(X, True)``; any other type → ``(type, False)``."""
    if get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint):
        rest = [arg for arg in get_args(hint) if arg is not type(None)]
        return functools.reduce(operator.or_, rest), True
    return hint, False


def choices_of(hint: Any) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal`` type or of a tuple of one (``tuple[Site, ...]``)."""
    hint, _ = without_none(hint)
    if get_origin(hint) is tuple:
        hint = get_args(hint)[0]
    return get_args(hint) if get_origin(hint) is Literal else None


def _as_list_fields(obj: Any) -> None:
    """Turn every tuple setting given as a list (config files, JSON) into a tuple."""
    hints = _type_hints(obj.__class__)
    for f in dataclasses.fields(obj):
        if get_origin(without_none(hints[f.name])[0]) is tuple:
            object.__setattr__(obj, f.name, _as_tuple(f.name, getattr(obj, f.name)))


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A settings class's resolved field types (resolving them is slow; classes do not change)."""
    return get_type_hints(cls)


def check_types(obj: Any) -> None:
    """Reject values of the wrong type (a string where an int belongs) or outside a
    ``Literal``'s choices; tuple settings given as lists become tuples."""
    _as_list_fields(obj)
    hints = _type_hints(obj.__class__)
    for f in dataclasses.fields(obj):
        value, (hint, optional) = getattr(obj, f.name), without_none(hints[f.name])
        if value is None and optional:
            continue
        choices = choices_of(hint)
        if choices is not None and get_origin(hint) is tuple:
            check_choices(f.name, value, choices)
            continue
        if choices is not None:
            if not isinstance(value, str):
                raise ConfigError(f.name, f"expected str, got {value!r}")
            check_choice(f.name, value, choices)
            continue
        expected = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}.get(hint)
        if expected is None:
            continue
        if (isinstance(value, bool) and hint is not bool) or not isinstance(value, expected):
            kind = f"{hint.__name__} or None" if optional else hint.__name__
            raise ConfigError(f.name, f"expected {kind}, got {value!r}")
        if f.name == "seed":
            check_seed(f.name, value)
        elif hint is int and isinstance(value, int) and abs(value) > MAX_INT:
            raise ConfigError(f.name, f"must be at most {MAX_INT} in size, got {value!r}")
        if hint is float and isinstance(value, (int, float)) and not _finite(value):
            raise ConfigError(f.name, f"must be a finite number, got {value!r}")


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer with switchable positional encoding.

    Defaults follow the nanoGPT-style model of Zuo et al. (6 layers, 6 heads, d=384,
    character vocabulary, pre-LN, no biases, tied embeddings).
    """

    vocab_size: int = setting(96, "Vocabulary size (training sets it from the data)")
    d_model: int = setting(384, "Hidden size")
    n_layers: int = setting(6, "Number of blocks", flag="--layers")
    n_heads: int = setting(6, "Attention heads", flag="--heads")
    max_seq_len: int = setting(256, "Learned position table size")
    pos_encoding: PosEncoding = setting("none", "Positional encoding")
    nope_layers: tuple[int, ...] = setting(
        (),
        "1-based layers whose attention skips an attention-level encoding, e.g. 2,4",
        shown="none",
    )
    rope_theta: float = setting(10000.0, "RoPE base")
    logit_scale: float = setting(
        1.0,
        "Factor on the 1/sqrt(head_dim) scale of the attention logits (Wang et al.'s "
        "λ sqrt(head_dim))",
    )
    head_scales: bool = setting(
        False, "Each head's logits get their own learnable factor, initialised to --logit-scale"
    )
    bidirectional: bool = setting(False, "Attention mask", flag="--bidirectional/--causal")
    norm: Norm = setting("layernorm", "Normalisation")
    norm_position: NormPosition = setting("pre", "Norm before (pre-LN) or after each sublayer")
    norm_eps: float = setting(1e-5, "Norm epsilon")
    bias: bool = setting(False, "Biases in linear layers and norms")
    mlp_ratio: int = setting(4, "MLP width as a multiple of the hidden size")
    mlp: Mlp = setting("gelu", "MLP: fc → GELU → proj, or Llama's gated proj(silu(gate) * up)")
    tie_embeddings: bool = setting(
        True, "Output layer shares the token embedding", flag="--tie-embeddings/--untie-embeddings"
    )
    dropout: float = setting(0.0, "Dropout probability")
    # Weight init (model.init_weights): every weight matrix, embeddings and output projections
    # included, is re-drawn by the scheme; only gpt2 scales the residual projections by
    # 1/sqrt(2 n_layers). kaiming_uniform is kaiming_uniform_(a=1): U(±sqrt(3 / fan_in)).
    init: Init = setting("normal", "Weight initialisation scheme")
    init_std: float = setting(0.02, "σ of normal/gpt2 init; half-width a of uniform(-a, a)")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "mlp_ratio"):
            check_positive(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ConfigError(
                "d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if encoding(self.pos_encoding).level == "rotary" and self.head_dim % 2:
            raise ConfigError(
                "d_model",
                f"{self.pos_encoding} needs an even head dimension, got {self.head_dim}",
            )
        check_positive("init_std", self.init_std)
        check_positive("norm_eps", self.norm_eps)
        check_positive("rope_theta", self.rope_theta)
        check_positive("logit_scale", self.logit_scale)
        if not 0 <= self.dropout < 1:
            raise ConfigError("dropout", f"must be in [0, 1), got {self.dropout!r}")
        for layer in self.nope_layers:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise ConfigError("nope_layers", f"expected layer numbers, got {layer!r}")
            if not 1 <= layer <= self.n_layers:
                raise ConfigError(
                    "nope_layers", f"layer {layer} is outside 1..{self.n_layers} (1-based)"
                )
        if self.nope_layers and not encoding(self.pos_encoding).in_attention:
            inside = ", ".join(e.name for e in ENCODINGS.values() if e.in_attention)
            raise ConfigError(
                "nope_layers",
                f"only applies to attention-level encodings ({inside}), "
                f"not pos_encoding={self.pos_encoding!r}",
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def attention_pe_layers(self) -> list[bool]:
        """Per layer (0-based list), whether attention applies the attention-level encoding."""
        uses = encoding(self.pos_encoding).in_attention
        return [uses and (i + 1) not in self.nope_layers for i in range(self.n_layers)]


@dataclass(frozen=True)
class AnalysisConfig:
    """What to feed a model and which statistics to collect."""

    seq_len: int = setting(256, "Sequence length")
    samples: int = setting(64, "Number of sequences")
    batch_size: int = setting(8, "Sequences per forward pass")
    input: Input = setting(
        "random",
        "N(0,1) vectors (Chi et al.), uniform token ids, a run's held-out task lines or text, or "
        "a task run's test prompts one per sequence, left-padded with newlines to --seq-len "
        "(Zuo et al.); a run directory or hf: model defaults to data",
    )
    sites: tuple[AnalysisSite, ...] = setting(
        DEFAULT_SITES,
        "Comma-separated sites to measure; attention is every layer's attention pattern, "
        "reduced in chunks to entropy and logit spread per head and position",
    )
    seed: int = setting(0, "Seed for weights and inputs")
    device: str = setting("auto", "auto, cpu, cuda[:N] or mps")
    dtype: Dtype = setting("float32", "Activation precision")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("seq_len", "samples", "batch_size"):
            check_positive(name, getattr(self, name))
        if self.seq_len < 3:
            raise ConfigError(
                "seq_len", f"must be >= 3 for the adjacency score, got {self.seq_len}"
            )
        check_device(self.device)

    @property
    def attn_entropy(self) -> bool:
        """Whether the attention pattern is among the sites."""
        return ATTENTION in self.sites

    @property
    def vector_sites(self) -> tuple[Site, ...]:
        """The sites whose activations are vectors (every site but the attention pattern)."""
        return tuple(cast(Site, site) for site in self.sites if site != ATTENTION)

    def check_model(self, model: ModelConfig) -> None:
        """Reject combinations that the model cannot run."""
        if encoding(model.pos_encoding).table and self.seq_len > model.max_seq_len:
            raise ConfigError(
                "seq_len",
                f"{self.seq_len} exceeds the learned position table (max_seq_len={model.max_seq_len})",
            )


@dataclass(frozen=True)
class HFConfig:
    """How to load and run a Hugging Face model (``hf:PATH``)."""

    text: str = setting(
        "default",
        "Text (analyze and probe: for --input data; evaluate: the held-out text): an embedded "
        "corpus's name (default, sotu; its held-out tail), a file or folder",
    )
    max_layers: int | None = setting(None, "Analyse only the first N layers", shown="all")
    trust_remote_code: bool = setting(
        False, "Let the model folder run its own Python code (auto_map); only for models you trust"
    )
    rope_off: tuple[int, ...] | Literal["all"] = setting(
        (), "Switch RoPE off in these 1-based layers, e.g. 4,8,12, or all", shown="none"
    )
    train_len: int | None = setting(
        None,
        "The length the model was trained on (evaluate)",
        shown="the config's max_position_embeddings",
    )

    def __post_init__(self) -> None:
        check_types(self)
        if self.train_len is not None:
            check_positive("train_len", self.train_len)
        if self.rope_off != "all":
            object.__setattr__(self, "rope_off", _as_tuple("rope_off", self.rope_off))
            _layer_numbers("rope_off", self.rope_off)


@dataclass(frozen=True)
class RunConfig:
    """A model and an analysis: what a run directory's ``config.json`` holds."""

    model: ModelConfig = field(default_factory=ModelConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)

    def __post_init__(self) -> None:
        self.analysis.check_model(self.model)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {
            "model": dataclasses.asdict(self.model),
            "analysis": dataclasses.asdict(self.analysis),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> RunConfig:
        check_sections(data, ("model", "analysis"), where)
        return cls(
            model=build(ModelConfig, data.get("model", {}), f"{where}.model"),
            analysis=build(AnalysisConfig, data.get("analysis", {}), f"{where}.analysis"),
        )


def build(cls: type, values: dict[str, Any], where: str) -> Any:
    """Build a config dataclass from a mapping, rejecting unknown keys; ``where`` names the
    table (``config.model``), and its last part becomes the section of the errors it raises."""
    if not isinstance(values, dict):
        raise ConfigError(where, f"expected a table of settings, got {values!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise ConfigError(where, f"unknown key {key!r}; allowed: {', '.join(names)}")
    try:
        return cls(**values)
    except ConfigError as exc:
        if exc.section is None and exc.field in names:  # one of this table's settings
            exc.section = where.rsplit(".", 1)[-1]
        raise


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML, YAML or JSON config file into a mapping; any problem is a one-line error."""
    path = Path(path)
    loaders = {".toml": "TOML", ".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}
    kind = loaders.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            "--config", f"{path}: unknown file type; allowed: .toml, .yaml, .yml, .json"
        )
    if not path.is_file():
        raise ConfigError("--config", f"{path}: no such file")
    try:
        text = path.read_text()
        if kind == "TOML":
            data = tomllib.loads(text)
        elif kind == "YAML":
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        detail = first_line(exc)
        raise ConfigError("--config", f"{path}: not valid {kind}: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            "--config", f"{path}: expected a mapping with [model] and [analysis] sections"
        )
    data.pop("environment", None)  # written into run directories' config.json; not a setting
    return data


@dataclass(frozen=True)
class TrainConfig:
    """How to train: optimiser, schedule, evaluation and checkpoints.

    Defaults follow Zuo et al.'s nanoGPT recipe (AdamW, weight decay 0.1, beta2 0.99, clip 1.0,
    linear warm-up then cosine decay to ``min_lr_ratio * lr``), shortened for a CPU.
    """

    steps: int = setting(2000, "Optimiser steps")
    batch_size: int = setting(32, "Global batch in sequences (split across torchrun processes)")
    seq_len: int = setting(256, "Training context (--layout padded: the task's longest line)")
    lr: float = setting(1e-3, "Peak learning rate")
    min_lr_ratio: float = setting(0.1, "Final learning rate as a fraction of the peak")
    warmup: int = setting(100, "Warm-up steps")
    weight_decay: float = setting(0.1, "AdamW weight decay")
    beta1: float = setting(0.9, "AdamW β1")
    beta2: float = setting(0.99, "AdamW β2")
    grad_clip: float = setting(1.0, "Gradient-norm clip, 0 = off")
    eval_every: int = setting(250, "Steps between evaluations")
    eval_samples: int = setting(512, "Task: test examples decoded per evaluation (all at the end)")
    eval_tokens: int = setting(32768, "Text: held-out tokens per evaluated length")
    checkpoint_every: int = setting(250, "Steps between checkpoints")
    keep_checkpoints: bool = setting(
        False, "Also keep each checkpoint's weights as checkpoints/step-N.safetensors"
    )
    compile: bool = setting(False, "torch.compile the model")
    precision: Precision = setting("auto", "auto: bfloat16 autocast on CUDA, float32 elsewhere")
    device: str = setting("auto", "auto, cpu, cuda[:N] or mps")
    seed: int = setting(0, "Seed for data, weights and dropout")
    init_from: str | None = setting(
        None,
        "Start from the weights of this training run's folder (same model settings; a fresh "
        "optimiser and schedule): fine-tuning, or a curriculum over task lengths",
        shown="random init",
    )
    stop_at: float | None = setting(
        None,
        "Task: stop once exact match on the held-out evaluation sample reaches this accuracy "
        "(checked every --eval-every steps; --steps is then the cap)",
        shown="off",
    )

    def __post_init__(self) -> None:
        check_types(self)
        if self.stop_at is not None and not 0 < self.stop_at <= 1:
            raise ConfigError("stop_at", f"must be in (0, 1], got {self.stop_at!r}")
        for name in ("steps", "batch_size", "seq_len", "lr", "eval_every", "checkpoint_every"):
            check_positive(name, getattr(self, name))
        for name in ("eval_samples", "eval_tokens"):
            check_positive(name, getattr(self, name))
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio!r}")
        for name in ("warmup", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(name, f"must be in [0, 1), got {getattr(self, name)!r}")
        check_device(self.device)


EMBEDDED_CORPORA: Final = {  # --corpus NAME -> (file in nopelab/data, what it holds)
    "default": ("web.txt.xz", "World English Bible"),
    "sotu": ("sotu.txt.xz", "State of the Union addresses 1790-2021"),
}
CORPUS_NAMES: Final = ", ".join(
    f"{name} ({about})" for name, (_, about) in EMBEDDED_CORPORA.items()
)


_BARE = re.compile(r"[a-z0-9_]*")  # what a part of a join of names looks like


def embedded_names(source: str, field: str = "--corpus") -> list[str] | None:
    """The names of ``source`` if it is an embedded corpus or a ``+``-join of them, else None
    (a file, a folder or ``hf:``; a name wins over a file of that name, which ``./NAME`` reads).
    A :class:`ConfigError` for ``field``: a join of bare names with an unknown or repeated one,
    or a join of embedded names that is also a file or folder here (which one is meant?)."""
    if source.startswith("hf:"):
        return None
    names = source.split("+")
    if len(names) == 1:
        return names if source in EMBEDDED_CORPORA else None
    if not all(_BARE.fullmatch(name) for name in names):
        return None  # a path such as c++.txt
    unknown = [name for name in names if name not in EMBEDDED_CORPORA]
    if Path(source).expanduser().exists():
        if unknown:
            return None  # a file such as my+notes
        raise ConfigError(
            field,
            f"{source!r} names embedded corpora and also a file or folder here; write "
            f"./{source} for the file or folder",
        )
    if unknown:
        raise ConfigError(
            field,
            f"unknown corpus name {', '.join(map(repr, unknown))} in {source!r} "
            f"(names: {', '.join(EMBEDDED_CORPORA)})",
        )
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:  # its held-out tail would be training text too
        raise ConfigError(field, f"{repeated!r} appears twice in {source!r}; name each corpus once")
    return names


@dataclass(frozen=True)
class CorpusConfig:
    """Which text to train a language model on, and how to tokenise it."""

    source: str = setting(
        "default",
        f"{CORPUS_NAMES}, names joined by + (sotu+default), a .txt file, a folder of .txt, "
        ".jsonl, .parquet or hf:NAME[:SPLIT]",
        flag="--corpus",
    )
    column: str = setting("text", "Text column of a .jsonl, .parquet or Hugging Face dataset")
    tokenizer: Tokenizer = setting("byte", "Bytes, or a byte-level BPE trained on the corpus")
    bpe_vocab: int = setting(4096, "BPE vocabulary size")
    val_fraction: float = setting(0.05, "Share of the corpus held out")
    objective: Objective = setting(
        "next",
        "What the model learns to predict: the next token (a causal LM), or masked tokens at "
        "their own positions (a masked LM, as BERT; with --bidirectional)",
    )
    mask_rate: float = setting(
        0.15,
        "A masked LM's share of hidden tokens (of which 80 % become a mask token, 10 % a random "
        "token, 10 % stay)",
    )

    def __post_init__(self) -> None:
        check_types(self)
        if not 0 < self.mask_rate < 1:
            raise ConfigError("mask_rate", f"must be in (0, 1), got {self.mask_rate!r}")
        if self.tokenizer == "bpe" and not 256 < self.bpe_vocab <= MAX_BPE_VOCAB:
            raise ConfigError(
                "bpe_vocab", f"must be in 257..{MAX_BPE_VOCAB} for a BPE, got {self.bpe_vocab}"
            )
        if not 0 < self.val_fraction < 1:
            raise ConfigError("val_fraction", f"must be in (0, 1), got {self.val_fraction!r}")


def check_device(device: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", device):
        raise ConfigError("device", f"unknown device {device!r}; allowed: auto, cpu, cuda[:N], mps")


def feature_names(combination: str) -> tuple[str, ...]:
    """``"norm+cos_last"`` → ``("norm", "cos_last")``, each checked against :data:`FEATURES`."""
    names = tuple(combination.split("+"))
    for name in names:
        check_choice("features", name, FEATURES)
    if len(set(names)) != len(names):
        raise ConfigError("features", f"{combination!r} names a feature twice")
    return names


@dataclass(frozen=True)
class EvaluateConfig:
    """Where ``nopelab evaluate`` measures a language model past its training length."""

    lengths: tuple[int, ...] = setting(
        (1, 2, 4, 8, 16), "Comma-separated multiples of the training length to evaluate at"
    )
    windows: int = setting(
        8, "Held-out windows per length (as many as the held-out text holds, up to this)"
    )
    buckets: int = setting(32, "Log-spaced buckets of positions per length")
    seed: int = setting(
        0, "Seed of the choice of windows where the held-out text holds more than --windows"
    )
    shuffle: tuple[int, ...] = setting(
        (),
        "Prefix lengths k for Haviv et al.'s shuffle: the loss on the rest of each window of "
        "the training length with its first k tokens in random order, e.g. 0,16,64",
        shown="none",
    )

    def __post_init__(self) -> None:
        check_types(self)
        check_seed("seed", self.seed)
        for name in ("windows", "buckets"):
            check_positive(name, getattr(self, name))
        if self.shuffle and (
            min(self.shuffle) < 0
            or any(a >= b for a, b in zip(self.shuffle, self.shuffle[1:], strict=False))
        ):
            raise ConfigError(
                "shuffle",
                "expected prefix lengths >= 0 in increasing order (e.g. 0,16,64), got "
                + ",".join(map(str, self.shuffle)),
            )
        increasing = all(a < b for a, b in zip(self.lengths, self.lengths[1:], strict=False))
        if not self.lengths or min(self.lengths) < 1 or not increasing:
            raise ConfigError(
                "lengths",
                "expected comma-separated whole numbers >= 1 in increasing order "
                f"(e.g. 1,2,4,8,16), got {','.join(map(str, self.lengths))}",
            )


@dataclass(frozen=True)
class HeadScaleConfig:
    """Wang et al.'s attention-logit scaling of a frozen language model (``nopelab
    headscale``): a factor per head trained at ``length``, or one ``uniform`` factor. ``None``
    is "not given": the training settings' defaults are filled in by the training."""

    length: float | None = setting(
        None,
        "Train a factor per head on windows of this multiple of the training length (the length "
        "to generalise to); needed unless --uniform",
        shown="none",
    )
    steps: int | None = setting(None, "Optimiser steps", shown="200")
    lr: float | None = setting(None, "AdamW learning rate (no weight decay)", shown="0.05")
    init_scale: float | None = setting(
        None, "Every head's starting factor, >= 1", shown="1 + 0.3973 ln LENGTH, Wang et al.'s fit"
    )
    batch_size: int | None = setting(None, "Windows per step", shown="4")
    seed: int | None = setting(None, "Seed of the training windows", shown="0")
    uniform: float | None = setting(
        None,
        "Train nothing: scale every head's logits by this factor (--logit-scale; Wang et al.: "
        "1.2 at 2x the training length, 1.5 at 4x, 1.8 at 8x)",
        shown="none",
    )

    TRAINING = ("length", "steps", "lr", "init_scale", "batch_size")  # not with --uniform
    NO_MODE = (
        "give the multiple of the training length to train head scales at (e.g. --length 4), "
        "or --uniform C for one factor"
    )

    def __post_init__(self) -> None:
        check_types(self)
        if self.seed is not None:  # taken in both modes (the uniform one draws nothing)
            check_seed("seed", self.seed)
        if self.uniform is not None:
            for name in self.TRAINING:
                if getattr(self, name) is not None:
                    raise ConfigError(name, "only applies to training head scales, not --uniform")
            _check_number("uniform", self.uniform, 0.0, above=True)
            return
        if self.length is None:
            raise ConfigError("length", self.NO_MODE)
        _check_number("length", self.length, 1.0)
        _check_number("init_scale", self.init_scale, 1.0)
        _check_number("lr", self.lr, 0.0, above=True)
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if value is not None:
                check_positive(name, value)


def _check_number(name: str, value: float | None, least: float, above: bool = False) -> None:
    """Refuse a value that is not finite or is below ``least`` (``above``: not above it)."""
    if value is None:
        return
    if not _finite(value) or value < least or (above and value == least):
        bound = f"> {least:g}" if above else f">= {least:g}"
        raise ConfigError(name, f"must be a finite number {bound}, got {value:g}")


@dataclass(frozen=True)
class ProbeConfig:
    """Which position probes to fit on the collected activations, and how.

    ``features`` holds feature sets, each one feature or a ``+``-joined combination
    (``"norm+cos_last"``). ``layers`` empty means every layer the chosen sites have.
    """

    layers: tuple[int, ...] = setting(
        (), "Layers to probe, e.g. 0,3,6 (embed is 0)", flag="--probe-layers", shown="all"
    )
    probes: tuple[Probe, ...] = setting(("linear-cls", "mlp-reg"), "Comma-separated probes")
    features: tuple[str, ...] = setting(
        ("raw",),
        f"Comma-separated feature sets from {', '.join(FEATURES)}; join with + to combine, "
        "e.g. raw,norm+cos_last",
    )
    target: Target = setting("position", "Absolute position, or distance to the last token")
    split: Split = setting(
        "sequences",
        "Held-out sequences, or train and test sequences from disjoint halves of the "
        "vocabulary (needs --input tokens)",
    )
    seeds: int = setting(
        3, "Probe repeats (split and initialisation) for mean ± std", flag="--probe-seeds"
    )
    test_fraction: float = setting(0.2, "Share of sequences held out")
    hidden: int = setting(64, "MLP probes: width of the hidden ReLU layer (Zuo et al.: 64)")
    epochs: int = setting(20, "Epochs of the MLP and linear-cls probes")
    batch_size: int = setting(128, "Probe training batch", flag="--probe-batch-size")
    lr: float = setting(1e-3, "Probe learning rate", flag="--probe-lr")
    memory_gb: float = setting(4.0, "Activations beyond this are kept in memory-mapped files")

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("seeds", "hidden", "epochs", "batch_size", "lr", "memory_gb"):
            check_positive(name, getattr(self, name))
        if not 0 < self.test_fraction < 1:
            raise ConfigError("test_fraction", f"must be in (0, 1), got {self.test_fraction!r}")
        _layer_numbers("layers", self.layers)
        if not self.features:
            raise ConfigError("features", f"needs at least one of: {', '.join(FEATURES)}")
        for combination in self.features:
            if not isinstance(combination, str):
                raise ConfigError(
                    "features", f"expected names like norm+cos_last, got {combination!r}"
                )
            feature_names(combination)


@dataclass(frozen=True)
class InterventionConfig:
    """Which edits to make to a trained model's activations, and where.

    ``equalize-norm`` rescales every token at the site to one common norm (removes the norm and
    variance signal, keeps every direction); ``leace`` erases linearly decodable position with
    LEACE. ``shuffle-norm`` and ``leace-shuffled`` are their controls: the same operation
    fitted on shuffled positions, so it leaves position alone; ``leace-rotated`` moves every
    token exactly as far as ``leace`` does, in a randomly rotated direction, losing nothing.
    """

    site: Site = setting("attn_out", "Site to edit")
    layers: tuple[int, ...] = setting(
        (), "Layers to edit, e.g. 1,2", flag="--at-layers", shown="every layer"
    )
    interventions: tuple[Intervention, ...] = setting(
        INTERVENTIONS,
        "Comma-separated edits (shuffle-norm, leace-shuffled, leace-rotated: controls)",
    )
    concept: Concept = setting(
        "onehot", "What LEACE erases: every position class, or the position as one number"
    )
    fit_samples: int = setting(64, "Held-out sequences to fit the edits on")
    eval_samples: int = setting(256, "Task: test examples decoded per evaluation")

    def __post_init__(self) -> None:
        check_types(self)
        check_positive("fit_samples", self.fit_samples)
        check_positive("eval_samples", self.eval_samples)
        _layer_numbers("layers", self.layers)
