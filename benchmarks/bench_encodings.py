"""The cost of each positional encoding in a training step, against NoPE.

Run: ``.venv/bin/python benchmarks/bench_encodings.py`` (``--rounds``: timed rounds, 20 by
default). One thread, as ``reproduce kazemnejad2023`` trains its models (two one-thread models
side by side). Everything is timed in this one run, the variants taking turns within each round
(``timing.interleaved``), and each row is reported as its best time and as a ratio to the
reference row, so the ratios hold on a shared machine where absolute times do not.

First table, one attention call (forward and backward) at the shape of the Kazemnejad task
model (batch 64, 4 heads, 24 positions, head size 16): ``scaled_dot_product_attention`` with
``is_causal`` (NoPE, RoPE) against an additive float mask (ALiBi, T5) given as (1, H, T, T),
the shape the model passes, and as (H, T, T), which PyTorch's CPU fused kernel does not take:
it falls back to the unfused math kernel. A mask that needs a gradient (T5's learned bias)
also takes the math kernel, whatever its shape.

Second table, the whole training step of that task model (``reproduce kazemnejad2023``'s
``small`` scale: d = 64, 4 layers, 4 heads, batch 64 x 24 token ids; forward, cross-entropy,
backward, AdamW) for every encoding.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from nopelab.config import POS_ENCODINGS, ModelConfig
from nopelab.models.transformer import Transformer
from timing import interleaved

B, H, T, D = 64, 4, 24, 16


def attention_calls() -> dict[str, Callable[[], object]]:
    """One attention forward + backward per variant, on the same random queries, keys, values."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=gen, requires_grad=True) for _ in range(3))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = (-torch.rand(H, T, T, generator=gen)).masked_fill(~causal, float("-inf"))
    learned = mask.clone().requires_grad_()

    def call(**kwargs: object) -> Callable[[], object]:
        return lambda: F.scaled_dot_product_attention(q, k, v, **kwargs).sum().backward()

    return {
        "is_causal": call(is_causal=True),
        "mask (1, H, T, T)": call(attn_mask=mask[None]),
        "mask (H, T, T)": call(attn_mask=mask),
        "learned mask (1, H, T, T)": call(attn_mask=learned[None]),
    }


def training_steps() -> dict[str, Callable[[], object]]:
    """One training step of the task model per encoding."""
    tokens = torch.randint(0, 96, (B, T), generator=torch.Generator().manual_seed(1))
    steps = {}
    for pe in POS_ENCODINGS:
        torch.manual_seed(0)
        model = Transformer(
            ModelConfig(d_model=64, n_layers=4, n_heads=4, max_seq_len=72, pos_encoding=pe)
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model: Transformer = model, opt: torch.optim.Optimizer = opt) -> None:
            logits = model(tokens)
            F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps[pe] = step
    return steps


def report(title: str, times: dict[str, list[float]], reference: str) -> None:
    best = {name: min(ts) for name, ts in times.items()}
    print(f"\n{title}\n{'':28s} {'best ms':>8s}  {'x ' + reference:>12s}")
    for name, t in best.items():
        print(f"{name:28s} {t * 1e3:8.2f}  {t / best[reference]:12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, one thread, {args.rounds} rounds")
    report(
        "attention forward + backward (B 64, H 4, T 24, head 16)",
        interleaved(attention_calls(), args.rounds),
        "is_causal",
    )
    report(
        "training step of the task model (d 64, 4 layers, batch 64 x 24)",
        interleaved(training_steps(), args.rounds),
        "none",
    )


if __name__ == "__main__":
    main()
