"""Synthetic Criteo-shaped click data with a learnable signal, and the AUC that scores it.

Numpy only, so the stratax programs and the TensorFlow program (its own environment) read the
same files. Criteo's display-ads layout: 13 dense count features, 26 categorical features whose
ids follow a power law over vocabularies from tens to millions of rows, a binary click label.
Here the label comes from a hidden model, so a model that learns reaches a known-good AUC:

    logit = tanh(log1p(dense) @ w) + sum_i hidden_i[id_i] + bias
    click ~ Bernoulli(sigmoid(logit))

with one hidden scalar per row of every table (a hidden 1-wide embedding). Ids are drawn from a
Zipf law truncated to the table (rank ``k`` with probability proportional to ``k ** -ZIPF_S``),
then mapped through a fixed permutation so hot rows spread over every shard of a partitioned
table.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

DENSE, CATEGORICAL = 13, 26
ZIPF_S = 1.1
BASE_CTR_LOGIT = -0.8   # about a quarter of the examples are clicks, as in Criteo
HIDDEN_TABLE_STD = 0.35
FILES = ("dense", "ids", "labels")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Sizes of one synthetic data set: rows of the smallest and largest table (the 26 tables
    grow geometrically between them), training and held-out examples, and the seed."""

    smallest: int
    largest: int
    train: int
    held_out: int
    seed: int = 0

    def table_sizes(self) -> list[int]:
        """The 26 vocabulary sizes, from ``smallest`` to ``largest``, geometrically spaced."""
        if not 1 < self.smallest <= self.largest:
            raise ValueError(f"Table sizes need 1 < smallest <= largest, got smallest="
                             f"{self.smallest}, largest={self.largest}.")
        sizes = np.geomspace(self.smallest, self.largest, CATEGORICAL)
        return [round(float(s)) for s in sizes]

    def key(self) -> str:
        """A directory name that changes whenever the data would."""
        return (f"s{self.smallest}_l{self.largest}_t{self.train}_h{self.held_out}"
                f"_seed{self.seed}_zipf{ZIPF_S}")


def _zipf_ids(rng: np.random.Generator, rows: int, count: int,
              permutation: np.ndarray) -> np.ndarray:
    """``count`` ids in ``[0, rows)``: truncated Zipf ranks mapped through ``permutation``."""
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -ZIPF_S)
    ranks = np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right")
    return permutation[np.minimum(ranks, rows - 1)].astype(np.int32)


def generate(config: DataConfig) -> dict[str, dict[str, np.ndarray]]:
    """The ``train`` and ``held_out`` splits, each ``{"dense", "ids", "labels"}``: float32
    (n, 13), int32 (n, 26), float32 (n, 1). Deterministic in ``config``."""
    rng = np.random.default_rng(config.seed)
    sizes = config.table_sizes()
    permutations = [rng.permutation(n) for n in sizes]
    hidden = [rng.normal(scale=HIDDEN_TABLE_STD, size=n) for n in sizes]
    dense_weights = rng.normal(scale=0.6, size=DENSE)
    total = config.train + config.held_out
    dense = np.log1p(rng.lognormal(mean=0.0, sigma=1.0, size=(total, DENSE))).astype(np.float32)
    ids = np.stack([_zipf_ids(rng, n, total, p) for n, p in zip(sizes, permutations, strict=True)],
                   axis=1)
    logit = (np.tanh((dense - dense.mean(axis=0)) @ dense_weights) + BASE_CTR_LOGIT
             + sum(h[ids[:, i]] for i, h in enumerate(hidden)))
    labels = (rng.random(total) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]
    cut = config.train
    return {"train": {"dense": dense[:cut], "ids": ids[:cut], "labels": labels[:cut]},
            "held_out": {"dense": dense[cut:], "ids": ids[cut:], "labels": labels[cut:]}}


def ensure(config: DataConfig, cache: Path) -> Path:
    """Writes the data set once under ``cache/<config.key()>`` (``.npy`` per split and field,
    and ``config.json``); returns that directory. Every system's program loads it."""
    root = cache / config.key()
    if (root / "config.json").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    for split, arrays in generate(config).items():
        for name, array in arrays.items():
            np.save(root / f"{split}_{name}.npy", array)
    (root / "config.json").write_text(json.dumps(
        {**dataclasses.asdict(config), "table_sizes": config.table_sizes()}) + "\n")
    return root


def load(root: Path, split: str) -> dict[str, np.ndarray]:
    """One split (``train`` or ``held_out``) written by ``ensure``."""
    return {name: np.load(Path(root) / f"{split}_{name}.npy") for name in FILES}


def table_sizes(root: Path) -> list[int]:
    """The vocabulary sizes recorded with the data set at ``root``."""
    return json.loads((Path(root) / "config.json").read_text())["table_sizes"]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic; tied scores share their average
    rank), exact, with no dependency beyond numpy."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        raise ValueError(f"AUC needs both classes, got {positives} positive and {negatives} "
                         "negative labels.")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]
    return float((ranks[labels].sum() - positives * (positives + 1) / 2)
                 / (positives * negatives))
