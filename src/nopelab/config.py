"""Validated configuration dataclasses.

Every field is checked when the object is built, so a bad value fails early with a
one-line :class:`~nopelab.errors.ConfigError` that names the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from nopelab.errors import ConfigError

POS_ENCODINGS = ("none", "learned", "sinusoidal", "rope", "alibi")
INITS = (
    "normal",
    "gpt2",
    "xavier_normal",
    "xavier_uniform",
    "kaiming_uniform",
    "uniform",
    "pytorch",
)
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
NORM_POSITIONS = ("pre", "post")
INPUTS = ("random", "tokens", "data", "prompts")
DTYPES = ("float32", "bfloat16", "float16")
SITES = ("embed", "attn_heads", "attn_out", "resid_mid", "mlp_out", "resid_post")  # model order
BLOCK_SITES = SITES[1:]
DEFAULT_SITES = tuple(site for site in SITES if site != "attn_heads")  # attn_heads on request


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


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(name, f"must be > 0, got {value!r}")


def _as_tuple(name: str, value: Any) -> tuple:
    """A list setting as a tuple; a bare string or scalar is a ConfigError (not a TypeError)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(name, f"expected a list, got {value!r}")
    return tuple(value)


MAX_INT = 2**31 - 1  # counts, sizes and lengths
MAX_SEED = 2**63 - 1
MAX_BPE_VOCAB = 2**20


def check_types(obj: Any) -> None:
    """Reject values of the wrong type (e.g. a string where an int belongs)."""
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        expected = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}.get(hint)
        if expected is None:
            continue
        if (isinstance(value, bool) and hint is not bool) or not isinstance(value, expected):
            raise ConfigError(f.name, f"expected {hint.__name__}, got {value!r}")
        limit = MAX_SEED if f.name.endswith("seed") else MAX_INT
        if hint is int and not isinstance(value, bool) and abs(value) > limit:
            raise ConfigError(f.name, f"must be at most {limit} in size, got {value!r}")
        if hint is float and not _finite(value):
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

    vocab_size: int = 96
    d_model: int = 384
    n_layers: int = 6
    n_heads: int = 6
    max_seq_len: int = 256
    pos_encoding: str = "none"
    nope_layers: tuple[int, ...] = ()  # 1-based layers whose attention ignores rope/alibi
    rope_theta: float = 10000.0
    bidirectional: bool = False
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    bias: bool = False
    mlp_ratio: int = 4
    mlp: str = "gelu"  # gelu: fc → GELU → proj; swiglu: proj(silu(gate) * up), as in Llama
    tie_embeddings: bool = True
    dropout: float = 0.0
    # Weight init (model.init_weights): every weight matrix, embeddings and output projections
    # included, is re-drawn by the scheme; only gpt2 scales the residual projections by
    # 1/sqrt(2 n_layers). kaiming_uniform is kaiming_uniform_(a=1): U(±sqrt(3 / fan_in)).
    init: str = "normal"
    init_std: float = 0.02  # sigma for normal/gpt2; half-width a for uniform(-a, a)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nope_layers", _as_tuple("nope_layers", self.nope_layers))
        check_types(self)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "mlp_ratio"):
            check_positive(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ConfigError(
                "d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.pos_encoding == "rope" and self.head_dim % 2:
            raise ConfigError("d_model", f"rope needs an even head dimension, got {self.head_dim}")
        check_choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        check_choice("norm", self.norm, NORMS)
        check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        check_choice("mlp", self.mlp, MLPS)
        check_choice("init", self.init, INITS)
        check_positive("init_std", self.init_std)
        check_positive("norm_eps", self.norm_eps)
        check_positive("rope_theta", self.rope_theta)
        if not 0 <= self.dropout < 1:
            raise ConfigError("dropout", f"must be in [0, 1), got {self.dropout!r}")
        for layer in self.nope_layers:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise ConfigError("nope_layers", f"expected layer numbers, got {layer!r}")
            if not 1 <= layer <= self.n_layers:
                raise ConfigError(
                    "nope_layers", f"layer {layer} is outside 1..{self.n_layers} (1-based)"
                )
        if self.nope_layers and self.pos_encoding not in ("rope", "alibi"):
            raise ConfigError(
                "nope_layers",
                "only applies to attention-level encodings (rope, alibi), "
                f"not pos_encoding={self.pos_encoding!r}",
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def attention_pe_layers(self) -> list[bool]:
        """Per layer (0-based list), whether attention applies rope/alibi."""
        uses = self.pos_encoding in ("rope", "alibi")
        return [uses and (i + 1) not in self.nope_layers for i in range(self.n_layers)]


@dataclass(frozen=True)
class AnalysisConfig:
    """What to feed a model and which statistics to collect."""

    seq_len: int = 256
    samples: int = 64
    batch_size: int = 8
    # random vectors (Chi et al.), uniform token ids, a run's own held-out data, or (task runs)
    # its test prompts one per sequence, left-padded with newlines to seq_len (Zuo et al.)
    input: str = "random"
    sites: tuple[str, ...] = DEFAULT_SITES
    attn_entropy: bool = False
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", _as_tuple("sites", self.sites))
        check_types(self)
        for name in ("seq_len", "samples", "batch_size"):
            check_positive(name, getattr(self, name))
        if self.seq_len < 3:
            raise ConfigError(
                "seq_len", f"must be >= 3 for the adjacency score, got {self.seq_len}"
            )
        check_choice("input", self.input, INPUTS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choices("sites", self.sites, SITES)
        check_device(self.device)

    def check_model(self, model: ModelConfig) -> None:
        """Reject combinations that the model cannot run."""
        if model.pos_encoding == "learned" and self.seq_len > model.max_seq_len:
            raise ConfigError(
                "seq_len",
                f"{self.seq_len} exceeds the learned position table (max_seq_len={model.max_seq_len})",
            )


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
        unknown = set(data) - {"model", "analysis"}
        if unknown:
            raise ConfigError(
                where, f"unknown section {sorted(unknown)[0]!r}; allowed: model, analysis"
            )
        return cls(
            model=build(ModelConfig, data.get("model", {}), f"{where}.model"),
            analysis=build(AnalysisConfig, data.get("analysis", {}), f"{where}.analysis"),
        )


def build(cls: type, values: dict[str, Any], where: str) -> Any:
    """Build a config dataclass from a mapping, rejecting unknown keys."""
    if not isinstance(values, dict):
        raise ConfigError(where, f"expected a table of settings, got {values!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise ConfigError(where, f"unknown key {key!r}; allowed: {', '.join(names)}")
    return cls(**values)


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
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError("--config", f"{path}: not valid {kind}: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            "--config", f"{path}: expected a mapping with [model] and [analysis] sections"
        )
    data.pop("environment", None)  # written into run directories' config.json; not a setting
    return data


PRECISIONS = ("auto", "float32", "bfloat16")
TOKENIZERS = ("byte", "bpe")


@dataclass(frozen=True)
class TrainConfig:
    """How to train: optimiser, schedule, evaluation and checkpoints.

    Defaults follow Zuo et al.'s nanoGPT recipe (AdamW, weight decay 0.1, beta2 0.99, clip 1.0,
    linear warm-up then cosine decay to ``min_lr_ratio * lr``), shortened for a CPU.
    """

    steps: int = 2000
    batch_size: int = 32  # global batch (split across processes under torchrun)
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 turns clipping off
    eval_every: int = 250
    eval_samples: int = 512  # task: test examples decoded at each evaluation (all at the end)
    eval_tokens: int = 32768  # text: held-out tokens per evaluated length
    checkpoint_every: int = 250
    compile: bool = False
    precision: str = "auto"  # auto: bfloat16 autocast on CUDA, float32 elsewhere
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_types(self)
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
        check_choice("precision", self.precision, PRECISIONS)
        check_device(self.device)


@dataclass(frozen=True)
class CorpusConfig:
    """Which text to train a language model on, and how to tokenise it."""

    source: str = (
        "default"  # default | a .txt file | a folder of .txt | .jsonl | .parquet | hf:NAME
    )
    column: str = "text"  # the text column of a .jsonl, .parquet or Hugging Face dataset
    tokenizer: str = "byte"
    bpe_vocab: int = 4096
    val_fraction: float = 0.05

    def __post_init__(self) -> None:
        check_types(self)
        check_choice("tokenizer", self.tokenizer, TOKENIZERS)
        if self.tokenizer == "bpe" and not 256 < self.bpe_vocab <= MAX_BPE_VOCAB:
            raise ConfigError(
                "bpe_vocab", f"must be in 257..{MAX_BPE_VOCAB} for a BPE, got {self.bpe_vocab}"
            )
        if not 0 < self.val_fraction < 1:
            raise ConfigError("val_fraction", f"must be in (0, 1), got {self.val_fraction!r}")


def check_device(device: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", device):
        raise ConfigError("device", f"unknown device {device!r}; allowed: auto, cpu, cuda[:N], mps")


FEATURES = ("raw", "norm", "variance", "cos_last", "cos_row")
PROBES = ("linear-cls", "mlp-cls", "linear-reg", "mlp-reg")
TARGETS = ("position", "distance")
SPLITS = ("sequences", "vocab")


def feature_names(combination: str) -> tuple[str, ...]:
    """``"norm+cos_last"`` → ``("norm", "cos_last")``, each checked against :data:`FEATURES`."""
    names = tuple(combination.split("+"))
    for name in names:
        check_choice("features", name, FEATURES)
    if len(set(names)) != len(names):
        raise ConfigError("features", f"{combination!r} names a feature twice")
    return names


@dataclass(frozen=True)
class ProbeConfig:
    """Which position probes to fit on the collected activations, and how.

    ``features`` holds feature sets, each one feature or a ``+``-joined combination
    (``"norm+cos_last"``). ``layers`` empty means every layer the chosen sites have.
    """

    layers: tuple[int, ...] = ()
    probes: tuple[str, ...] = ("linear-cls", "mlp-reg")
    features: tuple[str, ...] = ("raw",)
    target: str = "position"  # absolute position, or distance to the last token
    split: str = "sequences"  # held-out sequences, or sequences built from held-out tokens
    seeds: int = 3
    test_fraction: float = 0.2
    hidden: int = 64  # MLP probes: one hidden ReLU layer of this width (Zuo et al.: 64)
    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    memory_gb: float = 4.0  # activations beyond this are kept in memory-mapped files

    def __post_init__(self) -> None:
        for name in ("layers", "probes", "features"):
            object.__setattr__(self, name, _as_tuple(name, getattr(self, name)))
        check_types(self)
        for name in ("seeds", "hidden", "epochs", "batch_size", "lr", "memory_gb"):
            check_positive(name, getattr(self, name))
        if not 0 < self.test_fraction < 1:
            raise ConfigError("test_fraction", f"must be in (0, 1), got {self.test_fraction!r}")
        _layer_numbers("layers", self.layers)
        check_choices("probes", self.probes, PROBES)
        if not self.features:
            raise ConfigError("features", f"needs at least one of: {', '.join(FEATURES)}")
        for combination in self.features:
            if not isinstance(combination, str):
                raise ConfigError(
                    "features", f"expected names like norm+cos_last, got {combination!r}"
                )
            feature_names(combination)
        check_choice("target", self.target, TARGETS)
        check_choice("split", self.split, SPLITS)


INTERVENTIONS = ("equalize-norm", "shuffle-norm", "leace", "leace-shuffled", "leace-rotated")
CONCEPTS = ("onehot", "scalar")


@dataclass(frozen=True)
class InterventionConfig:
    """Which edits to make to a trained model's activations, and where.

    ``equalize-norm`` rescales every token at the site to one common norm (removes the norm and
    variance signal, keeps every direction); ``leace`` erases linearly decodable position with
    LEACE. ``shuffle-norm`` and ``leace-shuffled`` are their controls: the same operation
    fitted on shuffled positions, so it leaves position alone; ``leace-rotated`` moves every
    token exactly as far as ``leace`` does, in a randomly rotated direction, losing nothing.
    """

    site: str = "attn_out"
    layers: tuple[int, ...] = ()  # empty: every layer of the site
    interventions: tuple[str, ...] = INTERVENTIONS
    concept: str = "onehot"  # what LEACE erases: one-hot position (all classes) or the scalar
    fit_samples: int = 64  # sequences to fit the erasers and the common norm on

    def __post_init__(self) -> None:
        for name in ("layers", "interventions"):
            object.__setattr__(self, name, _as_tuple(name, getattr(self, name)))
        check_types(self)
        check_choice("site", self.site, SITES)
        check_positive("fit_samples", self.fit_samples)
        _layer_numbers("layers", self.layers)
        check_choices("interventions", self.interventions, INTERVENTIONS)
        check_choice("concept", self.concept, CONCEPTS)
