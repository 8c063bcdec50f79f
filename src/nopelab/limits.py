"""Memory budgets, checked before any work starts: what a model, its training, its statistics,
the fitting of interventions or a BPE tokenizer would need, against what the machine has.

The estimates count the large terms (weights, optimiser state, the activations of one batch, the
T x T statistics of every site), with constants measured as peak resident memory on our CPU
(``/usr/bin/time -f %M``): they refuse what cannot fit in one line, before an allocator fails
half-way through a run, and are not meant to be exact. The block sizes of the streaming
statistics (how much of a T x T matrix :mod:`nopelab.measure` holds at once) live here too, so
that the estimates and the measurement use the same ones.
"""

from __future__ import annotations

import os
from pathlib import Path

from nopelab.config import AnalysisConfig, InterventionConfig, ModelConfig
from nopelab.encodings import encoding
from nopelab.errors import ConfigError, UserError

GIB = 2**30
WEIGHTS = "--layers, --d-model or --vocab-size"
STATS = "--seq-len or --sites"
# per element of the kept cosine matrix (T x T up to 1024 positions, block means beyond): a
# float64 sum per site and layer (12 with its reduction), and what turning the sums into
# results, tables and figures takes once (64); per position, the float64 vectors of a site and
# layer (64); per similarity of a row block: float32, its float64 copies by distance, the pair
# counting's sort (32)
SITE_MATRIX, REPORT_MATRICES, SITE_VECTORS, ROW_BLOCK = 12, 64, 64, 32
# per logit of the attention statistics' chunk of query rows: the float32 logits, their softmax
# and its entropies, and what the allocator keeps between chunks
ATTENTION_CHUNK = 24


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux's MemAvailable where present)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parameter_count(cfg: ModelConfig) -> int:
    """The model's parameters, counted from its configuration (no model is built)."""
    d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    bias = int(cfg.bias)
    norm = d * (1 + (bias if cfg.norm == "layernorm" else 0))
    attention = 4 * d * d + 4 * d * bias + (cfg.n_heads if cfg.head_scales else 0)
    if cfg.mlp == "swiglu":
        mlp = 3 * d * hidden + (2 * hidden + d) * bias
    else:
        mlp = 2 * d * hidden + (hidden + d) * bias
    embeddings = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    embeddings += encoding(cfg.pos_encoding).parameters(cfg)
    final_norm = norm if cfg.norm_position == "pre" else 0
    return embeddings + cfg.n_layers * (2 * norm + attention + mlp) + final_norm


def forward_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, scores: bool = False) -> int:
    """The working memory of one forward pass without gradients: a layer's activations, the
    logits, and (``scores``: ALiBi's bias) a layer's attention matrix; PyTorch's fused causal
    attention does not materialise it."""
    tokens = batch_size * seq_len
    layer = tokens * cfg.d_model * (4 + 2 * cfg.mlp_ratio)
    matrix = batch_size * cfg.n_heads * seq_len * seq_len if scores else 0
    return 4 * (layer + matrix + tokens * cfg.vocab_size)


def check_analysis(cfg: ModelConfig, analysis: AnalysisConfig, statistics: bool = True) -> None:
    """Refuse an analysis whose model, batch or (``statistics``) T x T statistics per site and
    layer would not fit."""
    batch, seq_len = analysis.batch_size, analysis.seq_len
    activations = forward_bytes(cfg, batch, seq_len, scores=encoding(cfg.pos_encoding).scores)
    if analysis.attn_entropy:
        activations += attention_bytes(cfg.n_heads, batch, seq_len)
    _check(
        "analysing",
        {
            "weights": (4 * parameter_count(cfg), WEIGHTS),
            "activations": (activations, "--batch-size or --seq-len"),
            "statistics": (statistics_bytes(analysis, cfg.n_layers) if statistics else 0, STATS),
        },
    )


# ---------------------------------------------------------------- the statistics' block sizes
# how much of a T x T matrix the streaming statistics (nopelab.measure) hold at once

CHUNK_ELEMENTS = 2**22  # logits (batch x heads x query rows x keys) in one chunk: 16 MB of float32
BLOCK_ELEMENTS = 2**22  # similarities per sample in one row block (16 MB of float32)
MAX_MATRIX = 1024  # the kept mean cosine matrix has at most this many rows


def chunk_rows(batch_size: int, n_heads: int, seq_len: int) -> int:
    """Query rows per chunk: as many as keep a chunk of logits within :data:`CHUNK_ELEMENTS`
    (counting all ``seq_len`` keys), at least one."""
    return max(1, CHUNK_ELEMENTS // (batch_size * n_heads * seq_len))


def row_block(T: int, min_block: int = 64, align: int = 1) -> int:
    """Rows per block of :func:`nopelab.measure.metrics.cosine_row_blocks`: an eighth of T, at least ``min_block``, at
    most :data:`BLOCK_ELEMENTS` / T, rounded up to a multiple of ``align``."""
    block = max(min_block, min(-(-T // 8), BLOCK_ELEMENTS // T))
    return -(-block // align) * align


def matrix_block(seq_len: int, max_matrix: int = MAX_MATRIX) -> int:
    """Positions per side of the squares the kept cosine matrix averages over (1: all of it)."""
    return -(-seq_len // max_matrix)


def attention_bytes(n_heads: int, batch_size: int, seq_len: int) -> int:
    """The working memory of the attention statistics (the site ``attention``): one chunk of every
    head's logits, :func:`chunk_rows` query rows against all keys
    (a position bias, ALiBi's or T5's, is the T x T term of :func:`forward_bytes`)."""
    rows = min(seq_len, chunk_rows(batch_size, n_heads, seq_len))
    return ATTENTION_CHUNK * batch_size * n_heads * rows * seq_len


def statistics_bytes(analysis: AnalysisConfig, n_layers: int) -> int:
    """The statistics' state of every site and layer (the kept cosine matrix, at most
    ``MAX_MATRIX`` on a side, and a few vectors of T), one batch's row block of similarities
    with its pair counting, and the reduction of the kept matrices into a report."""
    T = analysis.seq_len
    side = -(-T // matrix_block(T))
    site_layers = sum(1 if site == "embed" else n_layers for site in analysis.vector_sites)
    rows = min(T, row_block(T, align=matrix_block(T)))
    block = ROW_BLOCK * analysis.batch_size * rows * T
    vectors = SITE_VECTORS * site_layers * T
    return (SITE_MATRIX * site_layers + REPORT_MATRICES) * side**2 + vectors + block


def check_statistics(analysis: AnalysisConfig, n_layers: int, n_heads: int = 0) -> None:
    """Refuse an analysis of a model of ``n_layers`` (and, with the site ``attention``, ``n_heads``
    query heads: a Hugging Face one, whose weights are checked apart) whose statistics would
    not fit."""
    parts = {"statistics": (statistics_bytes(analysis, n_layers), STATS)}
    if analysis.attn_entropy:
        heads = attention_bytes(n_heads, analysis.batch_size, analysis.seq_len)
        parts["attention statistics"] = (heads, "--batch-size or --seq-len")
    _check("analysing", parts)


def check_training(
    cfg: ModelConfig, batch_size: int, seq_len: int, flag: str | None = None
) -> None:
    """Refuse a training run whose weights, gradients and AdamW state (16 bytes a parameter)
    or whose activations kept for the backward pass would not fit; ``flag``: what the error
    names when one option set the model and its batch (``--sizes: 24x2``)."""
    _check(
        "training",
        {
            "weights and optimiser": (16 * parameter_count(cfg), flag or WEIGHTS),
            "activations": (
                backward_bytes(cfg, batch_size, seq_len),
                flag or "--batch-size, --seq-len or --layers",
            ),
        },
    )


def check_head_scales(cfg: ModelConfig, batch_size: int, seq_len: int) -> None:
    """Refuse training the head scales of a frozen model (its weights, and the activations the
    backward pass to every layer's queries keeps) where it would not fit."""
    _check(
        "training the head scales",
        {
            "weights": (4 * parameter_count(cfg), "run"),  # the run's model
            "activations": (backward_bytes(cfg, batch_size, seq_len), "--batch-size or --length"),
        },
    )


def backward_bytes(cfg: ModelConfig, batch_size: int, seq_len: int) -> int:
    """The activations a training step keeps for its backward pass, with its logits."""
    tokens = batch_size * seq_len
    kept = cfg.n_layers * tokens * cfg.d_model * (10 + 3 * cfg.mlp_ratio)
    logits = 3 * tokens * cfg.vocab_size  # logits, their softmax and its gradient
    scores = encoding(cfg.pos_encoding).scores
    return 4 * (kept + logits) + forward_bytes(cfg, batch_size, seq_len, scores)


def check_tokenizer(text_bytes: int, vocab_size: int) -> None:
    """Refuse a BPE that the corpus cannot yield (every merge needs a pair of symbols in the
    text) or whose training would not fit in memory."""
    if vocab_size > 256 + text_bytes:
        raise ConfigError(
            "bpe_vocab",
            f"a corpus of {text_bytes} bytes yields at most {256 + text_bytes} BPE tokens, "
            f"got {vocab_size}",
        )
    _check("training the BPE", {"corpus": (16 * text_bytes, "--corpus (a smaller one)")})


def check_interventions(
    cfg: ModelConfig,
    intervention: InterventionConfig,
    seq_len: int,
    layers: int,
    memory_gb: float,
) -> None:
    """Refuse interventions whose fit set or whose fitting of one edit would not fit.

    The fit set holds ``fit_samples`` sequences of ``seq_len`` float32 activations for each of
    the ``layers`` edited (in memory up to ``memory_gb``, memory-mapped beyond); fitting the
    most demanding edit is :func:`fitting_bytes` per token.
    """
    tokens = intervention.fit_samples * seq_len
    kept = 4 * tokens * cfg.d_model * layers
    if kept > memory_gb * GIB:
        kept = 0  # memory-mapped files
    classes = seq_len if intervention.concept == "onehot" else 1
    per_token = max(
        fitting_bytes(name, cfg.d_model, classes) for name in intervention.interventions
    )
    _check(
        "intervening",
        {
            "fit set": (kept, "--fit-samples or --at-layers"),
            "fitting of an edit": (tokens * per_token, "--fit-samples or --seq-len"),
        },
    )


def fitting_bytes(name: str, width: int, classes: int) -> int:
    """Peak bytes per token of fitting intervention ``name`` on activations ``width`` wide,
    measured as peak resident memory: the norm edits hold a float64 copy of them; LEACE also
    two centred copies, and ``classes`` position labels as integers, as floats and centred
    twice; ``leace-rotated`` makes one more float64 copy."""
    if not name.startswith("leace"):
        return 8 * width + 64
    return (32 if name == "leace-rotated" else 24) * width + 32 * classes + 128


def _check(doing: str, parts: dict[str, tuple[int, str]]) -> None:
    need = sum(size for size, _ in parts.values())  # MemAvailable excludes what is loaded
    have = available_memory()
    if need <= have:
        return
    name, (_, flags) = max(parts.items(), key=lambda item: item[1][0])
    shown = ", ".join(f"{part} {size_text(size)}" for part, (size, _) in parts.items())
    raise UserError(
        f"{flags}: {doing} needs about {size_text(need)} of memory, mostly for the {name} ({shown}); "
        f"{size_text(have)} is available"
    )


def size_text(size: int) -> str:
    """A size in bytes as people read it: ``1.5 GiB``, ``12 MiB``, ``40 KiB``."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", GIB)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"
