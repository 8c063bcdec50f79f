"""The variance-versus-similarity verdict: which signal alone recovers position best, per layer.

Chi et al. say position lives in the variance (equivalently, for a centred vector, the norm);
Zuo et al. say it lives in the cosine similarity of nearby embeddings. :func:`verdict` compares,
at every (model, state, site, layer), the regression probes fitted on ``variance`` alone,
``norm`` alone and the best cosine feature set (``cos_last`` or ``cos_row``) alone.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

SIGNALS = {"variance": ("variance",), "norm": ("norm",), "similarity": ("cos_last", "cos_row")}
GROUP = ["model", "state", "site", "layer"]


def verdict(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, state, site, layer): each signal's best MAE (seed mean and std), the
    baseline, the ``winner`` (lowest MAE) and whether it is ``decisive``: ahead of the runner-up
    by more than the sum of their seed standard deviations. Only regression probes count."""
    frame = pd.DataFrame(rows)
    frame = frame[frame["probe"].str.endswith("reg")]
    group = [g for g in GROUP if g in frame.columns]
    table = []
    for keys, lines in frame.groupby(group, sort=False):
        entry = dict(zip(group, keys, strict=True))
        entry["baseline"] = float(lines["baseline"].mean())
        scores = {}
        for signal, features in SIGNALS.items():
            candidates = lines[lines["features"].isin(features)]
            if candidates.empty:
                continue
            best = candidates.loc[candidates["mae"].idxmin()]
            scores[signal] = (float(best["mae"]), float(best["mae_std"]))
            entry[f"{signal}_mae"], entry[f"{signal}_std"] = scores[signal]
            if signal == "similarity":
                entry["similarity_features"] = best["features"]
        if len(scores) < 2:
            continue
        ranked = sorted(scores.items(), key=lambda item: item[1][0])
        (winner, (mae, std)), (_, (next_mae, next_std)) = ranked[0], ranked[1]
        entry["winner"] = winner
        entry["decisive"] = bool(next_mae - mae > std + next_std)
        table.append(entry)
    return pd.DataFrame(table)
