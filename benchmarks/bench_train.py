"""Training throughput (tokens/s) and model-FLOPs utilisation (MFU) of the Zuo model.

Run: ``.venv/bin/python benchmarks/bench_train.py`` (add ``--quick`` for batch sizes 1 and 8
only and fewer timed steps). Everything is measured in this one run, so MFU compares the
training step with the fp32 matmul peak of the same machine under the same thread count.

Model: the Zuo et al. nanoGPT-style model, i.e. ``ModelConfig()`` defaults (6 layers, 6 heads,
d = 384, vocab 96, pre-LN, GELU MLP, no biases, tied embeddings, NoPE), with
``max_seq_len = --seq-len`` (256 by default), fed uniformly random token ids.

Training step: forward, cross-entropy over all B x T positions, backward, gradient-norm clip
to 1.0, AdamW step (lr 3e-4, weight decay 0.1, betas (0.9, 0.99)), ``zero_grad(set_to_none=True)``.
After ``--warmup`` untimed steps, ``--steps`` steps are timed one by one; the table reports the
median step time (and the MFU of the best step, as a measure of what the machine can do when
nothing else runs on it). The rows labelled ``nopelab.training.train`` time the same model and batch
sizes through the real trainer (packed ``add`` lines, loss on answer tokens, logging), from
the per-step times in its ``metrics.csv``; ``--no-trainer`` skips them. The last table times
the smaller task model of ``reproduce zuo2025 --part trained`` (d = 128, 4 layers) through the
trainer on 2-digit ``add``, in the padded layout of its CPU recipe and in packed rows of 64
characters, with all threads and with one (the experiment trains two one-thread models side
by side): tokens/s and task lines/s. The table after it times the byte-level language model of
the LM reproductions (``chi2023 --part pretrained``, ``haviv2022``: d = 80, 3 layers, 4 heads,
251 k parameters, batch 32 x 128 bytes of the embedded corpus) through the trainer, NoPE and
RoPE, with one thread and with all: tokens/s.

Peak: best-of-``--repeats`` GFLOP/s of fp32 ``torch.mm`` on square matrices (1024, 2048) and on
the model's own training shapes (B*T = 2048 rows against the qkv, MLP and LM-head weights), all
with the threads torch uses. The peak is the maximum over every shape, measured once before and
once after the training runs, so a burst of noise during one measurement cannot inflate MFU.

Model FLOPs per token (PaLM appendix B, as in nanoGPT's ``estimate_mfu``)::

    F = 6 * N + 12 * L * d * T

* ``N``: parameters of every weight matrix used in a matmul = the ``nn.Linear`` weights, i.e.
  per layer qkv (3d^2), attention out (d^2), MLP in and out (8d^2), plus the LM head (V*d).
  The LM head shares its matrix with the token embedding (tied), and is counted once, as the
  head; the embedding lookup is a gather, not a matmul, and is not counted. LayerNorm gains
  are not counted. For the Zuo model N = 6 * 12 * 384^2 + 96 * 384 = 10,653,696.
* ``12 L d T``: the attention score and value matmuls (QK^T and PV: 2 * 2 * T * d FLOPs per
  token per layer forward, times 3 for forward plus backward), with T the sequence length.
  No causal halving: the full T x T square is counted even though a causal kernel can skip
  the upper triangle, which is the PaLM / nanoGPT convention (with halving the term would be
  6 L d T; at T = 256 it is 7.1 of 71.0 MFLOP per token, so halving lowers MFU by about 5%).
* Softmax, GELU, LayerNorm, cross-entropy, clipping and the optimizer are not counted.

MFU = F * tokens per second / measured peak FLOP/s.

On a GPU: ``--device cuda`` runs everything there (each timed call ends with a
``torch.cuda.synchronize``); ``--precision bfloat16`` trains under bf16 autocast, as
``nopelab train`` does on CUDA by default, and measures the peak with bf16 ``torch.mm``, so
MFU is against the peak of the precision the step runs in. float32 matmuls keep torch's
default (no TF32). On a CPU without bf16 matmul units ``--precision bfloat16`` is very slow and
only checks that the path works.

Options that matter on a small shared CPU (``--adamw``, ``--compile``, the thread count, the
glibc allocator's thresholds) and what they were measured to give: docs/performance.md. The
``others`` column says whether another process shared the cores while a row was timed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from nopelab.config import CorpusConfig, ModelConfig, PosEncoding, TrainConfig
from nopelab.models.transformer import Transformer
from nopelab.training.run import TrainRun
from nopelab.training.task_config import TaskConfig, max_line_len
from nopelab.training.tasks import make_splits
from nopelab.training.train import train
from timing import best_of

R = TypeVar("R")


# ------------------------------------------------------------------------ matmul peak


def matmul_shapes(cfg: ModelConfig, rows: int) -> dict[str, tuple[int, int, int]]:
    """(m, k, n) of square matmuls and of the model's linear layers at ``rows`` = B * T."""
    d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    return {
        "square 1024": (1024, 1024, 1024),
        "square 2048": (2048, 2048, 2048),
        f"{rows} x {d} @ {d} x {3 * d} (qkv)": (rows, d, 3 * d),
        f"{rows} x {d} @ {d} x {hidden} (mlp in)": (rows, d, hidden),
        f"{rows} x {hidden} @ {hidden} x {d} (mlp out)": (rows, hidden, d),
        f"{rows} x {d} @ {d} x {cfg.vocab_size} (lm head)": (rows, d, cfg.vocab_size),
    }


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so that wall times measure it; nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(
    shapes: dict[str, tuple[int, int, int]],
    repeats: int,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, float]:
    """Best-of-``repeats`` GFLOP/s of ``torch.mm`` in ``dtype`` at each (m, k, n)."""
    a = torch.randn(1024, 1024, device=device, dtype=dtype)
    start = time.perf_counter()
    while time.perf_counter() - start < 0.5:  # wake the thread pool (or GPU) and the clock
        torch.mm(a, a)
    synchronize(device)
    result = {}
    for name, (m, k, n) in shapes.items():
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        out = torch.empty(m, n, device=device, dtype=dtype)
        calls = max(1, int(2e9 // (2 * m * k * n)))  # time >= ~2 GFLOP per sample
        calls *= 100 if device.type == "cuda" else 1  # a GPU does that in microseconds

        def run(a=a, b=b, out=out, calls=calls) -> None:
            for _ in range(calls):
                torch.mm(a, b, out=out)
            synchronize(device)

        seconds = best_of(run, repeats) / calls
        result[name] = 2 * m * k * n / seconds / 1e9
    return result


# ------------------------------------------------------------------------ model FLOPs


@dataclass(frozen=True)
class FlopCount:
    matmul_params: int  # N
    dense: int  # 6 N per token
    attention: int  # 12 L d T per token

    @property
    def per_token(self) -> int:
        return self.dense + self.attention


def model_flops(model: Transformer, seq_len: int) -> FlopCount:
    """Training FLOPs per token, 6 N + 12 L d T (see the module docstring)."""
    cfg = model.cfg
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return FlopCount(n, 6 * n, 12 * cfg.n_layers * cfg.d_model * seq_len)


# ------------------------------------------------------------------------ other load


def cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process); None off Linux.

    Their difference over an interval is what other processes ran: on a shared 2-core machine
    a second job halves the throughput of a 2-thread OpenMP step (or worse), so the table
    says how many cores others used while each batch size was timed.
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return busy, own.user + own.system


def others_during(fn: Callable[[], R]) -> tuple[R, float | None]:
    """``fn()`` and the CPU cores that other processes used meanwhile, on average."""
    cpu_start, wall_start = cpu_seconds(), time.perf_counter()
    result = fn()
    cpu_end, wall = cpu_seconds(), time.perf_counter() - wall_start
    if cpu_start is None or cpu_end is None:
        return result, None
    busy, own = (end - start for end, start in zip(cpu_end, cpu_start, strict=True))
    return result, max(0.0, busy - own) / wall


# ------------------------------------------------------------------------ training step


def make_optimizer(model: nn.Module, impl: str) -> torch.optim.Optimizer:
    """AdamW as ``nopelab.training.train`` builds it (weight decay 0.1 on the weight matrices only),
    with the given implementation: ``forloop``, ``foreach`` or ``fused``."""
    kwargs = {"foreach": False}
    if impl == "foreach":
        kwargs = {"foreach": True}
    elif impl == "fused":
        kwargs = {"fused": True}
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.99), **kwargs)


def make_step(
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    compile_mode: str | None,
    precision: str = "float32",
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One training step; with ``compile_mode`` the forward and loss go through torch.compile;
    ``precision`` ``bfloat16`` runs them under bf16 autocast."""
    vocab = model.cfg.vocab_size
    params = [p for p in model.parameters() if p.requires_grad]
    device = next(model.parameters()).device
    half = precision == "bfloat16"

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))

    if compile_mode is not None:
        torch._dynamo.reset()  # a fresh graph per batch size: static shapes, no recompiles
        loss_fn = torch.compile(loss_fn, mode=None if compile_mode == "default" else compile_mode)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss_fn(x, y).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)

    return step


@dataclass(frozen=True)
class Timing:
    batch: int
    median: float
    best: float
    others: float | None  # cores used by other processes while timing, on average


def time_training(
    batch: int,
    seq_len: int,
    steps: int,
    warmup: int,
    seed: int,
    impl: str,
    compile_mode: str | None,
    device: torch.device,
    precision: str,
) -> tuple[Timing, FlopCount]:
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(max_seq_len=seq_len)).to(device).train()
    flops = model_flops(model, seq_len)
    step = make_step(model, make_optimizer(model, impl), compile_mode, precision)
    vocab = model.cfg.vocab_size
    x = torch.randint(0, vocab, (batch, seq_len)).to(device)
    y = torch.randint(0, vocab, (batch, seq_len)).to(device)
    for _ in range(warmup):
        step(x, y)
    times = []

    def timed() -> None:
        for _ in range(steps):
            start = time.perf_counter()
            step(x, y)
            times.append(time.perf_counter() - start)

    _, others = others_during(timed)
    return Timing(batch, statistics.median(times), min(times), others), flops


def trainer_timing(run: TrainRun, batch: int, seq_len: int, warmup: int) -> Timing:
    """Train ``run`` through ``nopelab.training.train`` itself; per-step times from its ``metrics.csv``
    after ``warmup`` steps."""
    with tempfile.TemporaryDirectory() as folder:
        _, others = others_during(lambda: train(run, Path(folder) / "run", progress=False))
        per_second = pd.read_csv(Path(folder) / "run" / "metrics.csv")["tokens_per_second"]
    times = [batch * seq_len / v for v in per_second.iloc[warmup:]]
    return Timing(batch, statistics.median(times), min(times), others)


def trainer_config(
    batch: int, seq_len: int, steps: int, device: str = "cpu", precision: str = "float32",
    seed: int = 0,
) -> TrainConfig:  # fmt: skip
    """``steps`` steps of the default recipe, without evaluations or checkpoints on the way."""
    return TrainConfig(
        steps=steps,
        batch_size=batch,
        seq_len=seq_len,
        eval_every=10**9,
        checkpoint_every=10**9,
        device=device,
        precision=precision,
        seed=seed,
    )


def time_trainer(
    batch: int, seq_len: int, steps: int, warmup: int, seed: int, device: str, precision: str
) -> Timing:
    """The same model through ``nopelab.training.train`` itself (packed ``add`` lines, loss on answers,
    clipping, fused AdamW, logging): per-step times from its ``metrics.csv``."""
    run = TrainRun(
        model=ModelConfig(max_seq_len=seq_len),
        train=trainer_config(batch, seq_len, warmup + steps, device, precision, seed),
        task=TaskConfig(name="add", train_size=2000, test_size=20),
    )
    return trainer_timing(run, batch, seq_len, warmup)


TASK_MODEL = ModelConfig(d_model=128, n_layers=4, n_heads=4)  # zuo2025 trained, small/medium


def time_task_model(
    layout: str, batch: int, steps: int, warmup: int, threads: int
) -> tuple[Timing, int, float]:
    """The zuo2025 ``trained`` task model (NoPE, d = 128, 4 layers) through ``nopelab.training.train``
    on Zuo-format 2-digit ``add``: ``padded`` lines (the CPU recipe, rows of one line) or
    ``packed`` rows of 64 characters (the recipe before it), with ``threads`` torch threads.
    Returns the timing, the row length and the task lines per row."""
    task = TaskConfig(name="add", max_len=2, train_size=2000, test_size=20, layout=layout)
    seq_len = max_line_len(task) if layout == "padded" else 64
    run = TrainRun(
        model=dataclasses.replace(TASK_MODEL, max_seq_len=seq_len),
        train=trainer_config(batch, seq_len, warmup + steps),
        task=task,
    )
    with torch_threads(threads):
        timing = trainer_timing(run, batch, seq_len, warmup)
    mean_line = statistics.mean(len(line.text) for line in make_splits(task, 0)[0])
    lines_per_row = 1.0 if layout == "padded" else seq_len / mean_line
    return timing, seq_len, lines_per_row


LM_MODEL = ModelConfig(d_model=80, n_layers=3, n_heads=4, vocab_size=256, max_seq_len=512)
LM_BATCH, LM_SEQ_LEN = 32, 128


def time_language_model(pos_encoding: PosEncoding, steps: int, warmup: int, threads: int) -> Timing:
    """The byte-level LM of the LM reproductions through ``nopelab.training.train`` on the
    embedded corpus (batch 32 x 128 bytes, lr 1e-2 as in their recipe), ``threads`` threads."""
    run = TrainRun(
        model=dataclasses.replace(LM_MODEL, pos_encoding=pos_encoding),
        train=dataclasses.replace(trainer_config(LM_BATCH, LM_SEQ_LEN, warmup + steps), lr=1e-2),
        corpus=CorpusConfig(source="default", tokenizer="byte"),
    )
    with torch_threads(threads):
        return trainer_timing(run, LM_BATCH, LM_SEQ_LEN, warmup)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def profile_step(batch: int, seq_len: int, seed: int, impl: str, rows: int) -> None:
    """Print the torch.profiler op breakdown (self CPU time) of one eager training step."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(seed)
    model = Transformer(ModelConfig(max_seq_len=seq_len)).train()
    step = make_step(model, make_optimizer(model, impl), None)
    x = torch.randint(0, model.cfg.vocab_size, (batch, seq_len))
    y = torch.randint(0, model.cfg.vocab_size, (batch, seq_len))
    for _ in range(2):
        step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step(x, y)
    print(f"\nProfile of 3 eager steps, batch {batch}, T = {seq_len} (self CPU time):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# ------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="batch sizes 1 and 8 only, fewer timed steps"
    )
    parser.add_argument("--repeats", type=int, default=5, help="best-of count for the peak")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 8; 4 quick)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (2; 3 compiled)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    parser.add_argument(
        "--batch-sizes",
        type=lambda s: [int(b) for b in s.split(",")],
        default=None,
        help="comma-separated (default 1,4,8,16,32; quick 1,8)",
    )
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument(
        "--adamw",
        choices=("forloop", "foreach", "fused"),
        default="fused",
        help="AdamW implementation (torch's CPU default is forloop)",
    )
    parser.add_argument(
        "--compile",
        nargs="?",
        const="default",
        default=None,
        choices=("default", "max-autotune-no-cudagraphs"),
        help="torch.compile the forward and loss (optionally with a mode)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="cpu | cuda[:N] (default cpu)")
    parser.add_argument(
        "--precision",
        choices=("float32", "bfloat16"),
        default="float32",
        help="bfloat16: train under bf16 autocast, peak from bf16 matmuls",
    )
    parser.add_argument(
        "--no-trainer",
        action="store_true",
        help="skip the rows timed through nopelab.training.train",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="B",
        help="also print the op breakdown of 3 eager steps at batch B",
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batch_sizes = args.batch_sizes or ([1, 8] if args.quick else [1, 4, 8, 16, 32])
    steps = args.steps or (4 if args.quick else 8)
    warmup = args.warmup if args.warmup is not None else (3 if args.compile else 2)
    cfg = ModelConfig(max_seq_len=args.seq_len)
    device = torch.device(args.device)
    dtype = getattr(torch, args.precision)
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}, "
        f"{args.precision}, AdamW {args.adamw}, compile {args.compile or 'off'}"
    )
    allocator = [f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith("MALLOC_")]
    allocator += [f"LD_PRELOAD={os.environ['LD_PRELOAD']}"] if "LD_PRELOAD" in os.environ else []
    print(f"allocator: {' '.join(allocator) or 'glibc defaults'}")
    shapes = matmul_shapes(cfg, rows=8 * args.seq_len)

    def peak_run() -> dict[str, float]:
        return matmul_gflops(shapes, args.repeats, device, dtype)

    before, others_before = others_during(peak_run)

    rows = []
    flops = None
    for batch in batch_sizes:
        timing, flops = time_training(
            batch,
            args.seq_len,
            steps,
            warmup,
            args.seed,
            args.adamw,
            args.compile,
            device,
            args.precision,
        )
        rows.append(timing)
    trainer_rows = (
        []
        if args.no_trainer
        else [
            time_trainer(batch, args.seq_len, steps, warmup, args.seed, args.device, args.precision)
            for batch in batch_sizes
        ]
    )

    after, others_after = others_during(peak_run)
    print(
        f"\n{args.precision} torch.mm, best of {args.repeats}, before / after the training runs "
        "(GFLOP/s):"
    )
    if others_before is not None and others_after is not None:
        print(f"  (other processes used {others_before:.2f} / {others_after:.2f} cores meanwhile)")
    for name in shapes:
        print(f"  {name:34s} {before[name]:7.1f} / {after[name]:7.1f}")
    peak = max(*before.values(), *after.values())
    print(f"  peak {peak:.1f} GFLOP/s")

    assert flops is not None
    print(
        f"\nZuo model (L = {cfg.n_layers}, H = {cfg.n_heads}, d = {cfg.d_model}, V = "
        f"{cfg.vocab_size}), T = {args.seq_len}: N = {flops.matmul_params:,} matmul params; "
        f"per token 6N = {flops.dense / 1e6:.1f} + 12LdT = {flops.attention / 1e6:.1f} "
        f"= {flops.per_token / 1e6:.1f} MFLOP"
    )
    print(f"{steps} timed steps after {warmup} warm-up; step time is the median\n")
    print(
        f"{'batch':>5s} {'tokens/s':>9s} {'step ms':>9s} {'GFLOP/s':>8s} {'MFU':>6s} "
        f"{'best MFU':>9s} {'others':>7s}"
    )
    for label, timings in (("bare step", rows), ("nopelab.training.train", trainer_rows)):
        if timings:
            print(label)
        for t in timings:
            print_row(t, args.seq_len, flops.per_token, peak)
    lm_rows: list[Timing] = []
    if not args.no_trainer and args.device == "cpu" and args.precision == "float32":
        print(
            "\nzuo2025 trained task model (NoPE, d = 128, 4 layers, 4 heads) through "
            "nopelab.training.train, 2-digit add; lines/s = rows/s for padded rows of one line"
        )
        print(
            f"{'layout':>7s} {'batch':>5s} {'T':>3s} {'threads':>7s} {'tokens/s':>9s} {'lines/s':>8s}"
        )
        for layout, batch in (("packed", 64), ("padded", 128)):
            for threads in sorted({1, torch.get_num_threads()}):
                t, seq_len, lines_per_row = time_task_model(layout, batch, steps, warmup, threads)
                lines = batch * lines_per_row / t.median
                print(
                    f"{layout:>7s} {batch:5d} {seq_len:3d} {threads:7d} "
                    f"{batch * seq_len / t.median:9.0f} {lines:8.0f}"
                )
        print(
            "\nbyte-level LM of the LM reproductions (d = 80, 3 layers, 4 heads, batch 32 x 128 "
            "bytes of the embedded corpus) through nopelab.training.train"
        )
        print(f"{'encoding':>8s} {'threads':>7s} {'tokens/s':>9s} {'others':>7s}")
        for pos_encoding in ("none", "rope"):
            for threads in sorted({1, torch.get_num_threads()}):
                t = time_language_model(pos_encoding, steps, warmup, threads)
                lm_rows.append(t)
                others = "    n/a" if t.others is None else f"{t.others:7.2f}"
                tokens = LM_BATCH * LM_SEQ_LEN / t.median
                print(f"{pos_encoding:>8s} {threads:7d} {tokens:9.0f} {others}")

    busy = [t for t in rows + trainer_rows + lm_rows if t.others is not None and t.others > 0.1]
    if busy:
        print(
            "'others': CPU cores that other processes used while that row was timed; "
            f"{len(busy)} row(s) above 0.1 were slowed by them: rerun on an idle machine."
        )

    if args.profile:
        profile_step(args.profile, args.seq_len, args.seed, args.adamw, rows=20)


def print_row(t: Timing, seq_len: int, per_token: int, peak: float) -> None:
    tokens = t.batch * seq_len
    achieved = tokens * per_token / t.median / 1e9
    best = tokens * per_token / t.best / 1e9
    print(
        f"{t.batch:5d} {tokens / t.median:9.0f} {t.median * 1e3:9.1f} {achieved:8.1f} "
        f"{achieved / peak:6.1%} {best / peak:9.1%} "
        + ("    n/a" if t.others is None else f"{t.others:7.2f}")
    )


if __name__ == "__main__":
    main()
