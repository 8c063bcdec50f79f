"""kazemnejad2023 --part tasks: ranks and MRR follow from the accuracies (worked out by hand),
a learned table covers the longest tested line, and each length's test set has that length."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from nopelab.config import ModelConfig
from nopelab.experiments.kazemnejad2023.tasks import (
    SCALES,
    STRETCH,
    break_table,
    breaks_answer,
    length_test,
    mechanisms,
    model_table,
    mrr_table,
    nope_answer,
    rank_table,
    seed_mrr_table,
    settings,
    task_config,
    verdicts,
    versus_answer,
)
from nopelab.measure.metrics import adjacency_score_bruteforce, cosine_matrix
from nopelab.models.transformer import build_model
from nopelab.training.task_config import max_line_len
from nopelab.training.task_kinds import TASK_KINDS, Example
from nopelab.training.tasks import encode, greedy_answers, make_splits


def models(ood: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    """Per-model rows: each (task, encoding) at one accuracy per seed, all learned."""
    return pd.DataFrame(
        [
            {"task": task, "pos_encoding": pe, "seed": seed, "in_distribution_accuracy": 1.0,
             "ood_accuracy": value, "learned": True}
            for (task, pe), values in ood.items()
            for seed, value in enumerate(values)
        ]
    )  # fmt: skip


def test_ranks_share_ties_and_mrr_is_their_mean_reciprocal_over_tasks() -> None:
    frame = models(
        {
            ("copy", "none"): [0.8, 1.0],  # mean 0.9: rank 1
            ("copy", "learned"): [0.1, 0.1],  # 0.1 ties with sinusoidal: ranks 3 and 4 -> 3.5
            ("copy", "sinusoidal"): [0.15, 0.05],  # 0.1, summed in another order
            ("copy", "rope"): [0.5, 0.5],  # rank 2
            ("copy", "alibi"): [0.0, 0.0],  # rank 5
            ("add", "none"): [0.4, 0.4],  # three-way tie for ranks 2, 3, 4 -> 3
            ("add", "learned"): [0.3, 0.5],
            ("add", "sinusoidal"): [0.2, 0.2],  # rank 5
            ("add", "rope"): [0.8, 0.8],  # rank 1
            ("add", "alibi"): [0.4, 0.4],
        }
    )
    ranks = rank_table(frame).set_index(["task", "pos_encoding"])
    assert ranks.loc[("copy", "none"), "ood_accuracy"] == pytest.approx(0.9)
    assert ranks.loc[("copy", "none"), "seeds"] == 2
    want = {
        ("copy", "none"): 1, ("copy", "rope"): 2, ("copy", "learned"): 3.5,
        ("copy", "sinusoidal"): 3.5, ("copy", "alibi"): 5,
        ("add", "rope"): 1, ("add", "none"): 3, ("add", "learned"): 3, ("add", "alibi"): 3,
        ("add", "sinusoidal"): 5,
    }  # fmt: skip
    assert ranks["rank"].to_dict() == want
    by_seed = seed_mrr_table(frame)
    mrr = mrr_table(rank_table(frame), by_seed).set_index("pos_encoding")
    assert list(mrr.index) == ["none", "learned", "sinusoidal", "rope", "alibi"]
    by_hand = {
        "none": (1 + 1 / 3) / 2,  # 0.667
        "learned": (1 / 3.5 + 1 / 3) / 2,  # 0.310
        "sinusoidal": (1 / 3.5 + 1 / 5) / 2,  # 0.243
        "rope": (1 / 2 + 1) / 2,  # 0.75
        "alibi": (1 / 5 + 1 / 3) / 2,  # 0.267
    }
    assert mrr["mrr"].to_dict() == pytest.approx(by_hand)
    assert (mrr["tasks"] == 2).all()
    assert mrr.loc["sinusoidal", "published_mrr"] == mrr.loc["learned", "published_mrr"] == 0.22
    # each seed's own ranks: seed 0 ranks add's NoPE and ALiBi 2.5 (tied below RoPE), seed 1
    # 3.5 (below RoPE and learned); copy's NoPE is first and ALiBi last at both
    seed_none = {0: (1 + 1 / 2.5) / 2, 1: (1 + 1 / 3.5) / 2}
    seed_alibi = {0: (1 / 5 + 1 / 2.5) / 2, 1: (1 / 5 + 1 / 3.5) / 2}
    got = by_seed.set_index(["pos_encoding", "seed"])["mrr"]
    for seed in (0, 1):
        assert got[("none", seed)] == pytest.approx(seed_none[seed])
        assert got[("alibi", seed)] == pytest.approx(seed_alibi[seed])
    assert mrr.loc["none", "mrr_seed_mean"] == pytest.approx(sum(seed_none.values()) / 2)
    assert mrr.loc["none", "mrr_seed_std"] == pytest.approx(
        abs(seed_none[0] - seed_none[1]) / 2**0.5
    )
    verdict = verdicts(mrr.reset_index(), frame, by_seed)
    assert verdict["best"] == ["rope"] and not verdict["nope_best"]
    assert nope_answer(verdict, mrr.reset_index()).startswith("No: RoPE has the highest MRR (0.75)")
    versus = verdict["nope_versus"]["alibi"]
    assert versus["difference"] == pytest.approx(0.4) and versus["difference_std"] == pytest.approx(
        0
    )
    assert (versus["above"], versus["level"], versus["below"]) == (2, 0, 0)
    assert set(verdict["nope_versus"]) == {"alibi"}  # no T5 models in this frame
    assert versus_answer(verdict, 2) == (
        "NoPE's MRR minus ALiBi's, seed by seed: +0.40 ± 0.00 (NoPE above at 2 of 2 seeds, "
        "level at 0, below at 0)."
    )


def test_a_tie_at_the_top_and_an_unlearned_model_are_said() -> None:
    frame = models({("copy", pe): [0.5] for pe in ("none", "learned", "rope")})
    frame.loc[1, ["in_distribution_accuracy", "learned"]] = [0.5, False]
    by_seed = seed_mrr_table(frame)
    mrr = mrr_table(rank_table(frame), by_seed)
    assert mrr["mrr"].tolist() == pytest.approx([0.5, 0.5, 0.5])  # all share rank 2
    assert (mrr["tasks_separating"] == 0).all() and mrr["mrr_separating"].isna().all()
    assert (mrr["mrr_seed_std"] == 0).all()  # one seed
    verdict = verdicts(mrr, frame, by_seed)
    assert verdict["nope_best"] and not verdict["nope_alone_best"]
    assert verdict["not_learned"] == ["copy learned seed 0"]
    assert nope_answer(verdict, mrr).startswith("Tied: NoPE shares the highest MRR (0.50)")


def test_model_table_means_each_length_in_and_out_of_distribution() -> None:
    rows = [
        {"task": "copy", "pos_encoding": "none", "seed": 0, "length": k, "accuracy": a,
         "in_distribution": k <= 2}
        for k, a in zip((1, 2, 3, 4, 5, 6), (1.0, 0.8, 0.3, 0.0, 0.0, 0.3), strict=True)
    ]  # fmt: skip
    held_out = [{"task": "copy", "pos_encoding": "none", "seed": 0, "held_out_accuracy": h}
                for h in (0.95, 0.85)]  # fmt: skip
    table = model_table(pd.DataFrame(rows), pd.DataFrame(held_out[:1]))
    assert table.loc[0, "in_distribution_accuracy"] == pytest.approx(0.9)
    assert table.loc[0, "ood_accuracy"] == pytest.approx(0.15)
    assert bool(table.loc[0, "learned"])
    # learned or not by the held-out lines, whatever the mean over 1..L says
    table = model_table(pd.DataFrame(rows), pd.DataFrame(held_out[1:]))
    assert table.loc[0, "in_distribution_accuracy"] == pytest.approx(0.9)
    assert not bool(table.loc[0, "learned"])


def test_a_learned_table_covers_the_longest_tested_line_and_decodes_it() -> None:
    for scale in SCALES:
        for m in settings(scale, 0, "cpu").models:
            task_cfg = m.run.task
            assert task_cfg is not None and task_cfg.train_lengths == (1, m.max_len)
            assert m.max_len == SCALES[scale].max_len[m.task]
            tested = dataclasses.replace(task_cfg, test_max_len=STRETCH * m.max_len)
            assert m.run.model.max_seq_len == max_line_len(tested)
            assert m.run.train.seq_len == max_line_len(task_cfg) < m.run.model.max_seq_len
    smoke = next(m for m in settings("smoke", 0, "cpu").models if m.pos_encoding == "learned")
    kind = TASK_KINDS[smoke.task]
    example = kind.example(kind.longest(STRETCH * smoke.max_len), "plain")
    model = build_model(smoke.run.model, 0)
    (written,) = greedy_answers(model, [example])  # every position the decoding needs exists
    assert len(written) <= len(example.answer) + 1


@pytest.mark.parametrize("task", ["copy", "reverse", "add"])
def test_each_length_test_set_has_that_length_and_avoids_training_prompts(task: str) -> None:
    cfg = task_config(task, 3, 300, 32)
    trained = {e.prompt for e in make_splits(cfg, 0)[0]}
    kind = TASK_KINDS[task]
    for length in range(1, 10):
        examples, seen = length_test(cfg, length, 40, 0, trained)
        width = len(kind.example(kind.longest(length), "plain").prompt)
        assert len(examples) == min(40, kind.count("plain", length))
        assert {len(e.prompt) for e in examples} == {width}  # every operand has that length
        assert len({e.prompt for e in examples}) == len(examples)
        assert seen == sum(e.prompt in trained for e in examples)
        unseen = kind.count("plain", length) - len({p for p in trained if len(p) == width})
        assert seen == max(0, len(examples) - unseen)  # training prompts only where needed
        again, _ = length_test(cfg, length, 40, 0, trained)
        assert again == examples  # the same set for every encoding of a seed


def test_mechanisms_equal_brute_force_on_the_kept_activations() -> None:
    """Lines of the most common length only; the variance slope and adjacency score from the
    whole attn_out activations, kept by a plain hook."""
    cfg = ModelConfig(vocab_size=40, d_model=32, n_heads=2, n_layers=2, max_seq_len=32)
    model = build_model(cfg, seed=0).eval()
    sums = [("12", "34", "64"), ("55", "55", "011"), ("10", "21", "31"), ("20", "30", "05")]
    examples = [Example(f"{a}+{b}=", c) for a, b, c in sums]  # 9 or 10 characters a line
    kept: dict[int, torch.Tensor] = {}
    handles = [
        block.attn.register_forward_hook(
            lambda m, i, out, layer=layer: kept.__setitem__(layer, out.detach())
        )
        for layer, block in enumerate(model.blocks, start=1)
    ]
    try:
        rows = mechanisms(model, examples, torch.device("cpu"))
        with torch.inference_mode():
            model(torch.tensor([encode(e.text) for e in examples if len(e.text) == 9]))
    finally:
        for handle in handles:
            handle.remove()
    assert [row["layer"] for row in rows] == [1, 2]
    for row in rows:
        h = kept[row["layer"]].double()  # (3, 9, d): the three 9-character lines
        assert row["tokens"] == 9 and row["lines"] == 3
        variance = h.var(-1, correction=0).mean(0).numpy()
        slope = np.polyfit(np.log(np.arange(1, 10)), np.log(variance), 1)[0]
        assert row["variance_slope"] == pytest.approx(slope, rel=1e-4)
        adjacency = adjacency_score_bruteforce(cosine_matrix(h)).score.mean()
        assert row["adjacency"] == pytest.approx(adjacency, abs=1e-12)
        assert 0 < row["entropy_ratio"] <= 1 + 1e-6


def test_breaks_are_found_at_known_lengths_and_ordered() -> None:
    """L = 4, lengths 1..12. NoPE: accuracy falls from 7; the variance slope, linear in log
    length, jumps from 6; adjacency and entropy never move. RoPE: nothing breaks."""
    L, lengths = 4, np.arange(1, 13)
    rows, curves = [], []
    for pe in ("none", "rope"):
        broken = pe == "none"
        for n in lengths:
            right = 0.1 if broken and n >= 7 else 1.0
            rows.append({"task": "copy", "pos_encoding": pe, "seed": 0, "max_len": L,
                         "length": n, "accuracy": right})  # fmt: skip
            slope = -1 + 0.05 * math.log(n) + (0.5 if broken and n >= 6 else 0)
            curves.append({"task": "copy", "pos_encoding": pe, "seed": 0, "max_len": L,
                           "length": n, "variance_slope": slope, "adjacency": 0.8,
                           "entropy_ratio": 0.6 - 0.01 * math.log(n)})  # fmt: skip
    learned = pd.DataFrame(
        [
            {"task": "copy", "pos_encoding": pe, "seed": 0, "learned": True}
            for pe in ("none", "rope")
        ]
    )
    table = break_table(pd.DataFrame(rows), pd.DataFrame(curves), learned)
    table = table.set_index("pos_encoding")
    nope, rope = table.loc["none"], table.loc["rope"]
    assert nope["accuracy_break"] == 7 and nope["variance_slope_departure"] == 6
    assert pd.isna(nope["adjacency_departure"]) and pd.isna(nope["entropy_ratio_departure"])
    assert nope["accuracy_vs_variance_slope"] == "after"  # lengths: 6 comes before 7
    assert bool(nope["learned"]) and bool(rope["learned"])
    assert nope["accuracy_vs_adjacency"] == "only first"
    assert nope["variance_vs_adjacency"] == "only first"
    assert pd.isna(rope["accuracy_break"]) and rope["variance_vs_adjacency"] == "neither"
    text = breaks_answer(table.reset_index())
    assert text.startswith("Of the 1 models that learned their task and whose exact match breaks")
    assert "the variance slope departs before it in 1" in text
    assert "the adjacency score departs never in 1" in text
    assert text.endswith("the variance slope departs alone in 1, neither departs in 1.")
    unlearned = table.reset_index().assign(learned=False)
    assert breaks_answer(unlearned).startswith("No model that learned its task breaks")


def test_mrr_separating_leaves_out_a_task_every_encoding_ties() -> None:
    """Copy separates NoPE (1) from RoPE (2) and learned (3); on add all three score 0."""
    accuracy = {"none": 0.9, "rope": 0.5, "learned": 0.1}
    frame = models(
        {("copy", pe): [a] for pe, a in accuracy.items()} | {("add", pe): [0.0] for pe in accuracy}
    )
    mrr = mrr_table(rank_table(frame), seed_mrr_table(frame)).set_index("pos_encoding")
    assert mrr["mrr"].to_dict() == pytest.approx(
        {"none": (1 + 1 / 2) / 2, "rope": (1 / 2 + 1 / 2) / 2, "learned": (1 / 3 + 1 / 2) / 2}
    )
    assert mrr["mrr_separating"].to_dict() == pytest.approx(
        {"none": 1, "rope": 1 / 2, "learned": 1 / 3}
    )
    assert (mrr["tasks_separating"] == 1).all()
