"""Summaries of repetitions: min / median / max, spread flag, ratios of medians."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

SPREAD_FLAG = 0.20  # flag a row when (max - min) / median exceeds this


@dataclasses.dataclass
class Summary:
    """min / median / max of one metric over the successful repetitions."""

    min: float
    median: float
    max: float
    n: int

    @property
    def spread(self) -> float:
        """(max - min) / median; 0 for a single sample."""
        return (self.max - self.min) / self.median if self.median else 0.0

    @property
    def flagged(self) -> bool:
        """True when the spread is too large to trust the median alone."""
        return self.spread > SPREAD_FLAG


def summarize(values: list[float]) -> Summary | None:
    """Summary of ``values``, or None when there are none."""
    if not values:
        return None
    return Summary(min(values), statistics.median(values), max(values), len(values))


@dataclasses.dataclass
class ConfigOutcome:
    """All repetitions of one configuration, and what the table shows for it."""

    key: str
    system: str
    workload: str
    spe: int
    status: str  # "ok", "failed", "not installed"
    reason: str
    reps: list[dict[str, Any]]

    def metric(self, name: str) -> Summary | None:
        """Summary of ``name`` over the successful repetitions (None if not ok)."""
        if self.status != "ok":
            return None
        return summarize([r[name] for r in self.reps if r.get(name) is not None])

    def to_json(self) -> dict[str, Any]:
        """Raw record for the results JSON: every repetition plus the summaries."""
        out: dict[str, Any] = dataclasses.asdict(self)
        for name in ("samples_per_s", "median_epoch_samples_per_s", "first_execution_s",
                     "peak_rss_mib", "final_loss", "import_s", "cpu_s"):
            s = self.metric(name)
            out[f"{name}_summary"] = dataclasses.asdict(s) if s else None
        return out


def ratio(num: ConfigOutcome | None, den: ConfigOutcome | None) -> float | None:
    """Median samples/s of ``num`` over that of ``den``; None when either is missing."""
    if num is None or den is None:
        return None
    a, b = num.metric("samples_per_s"), den.metric("samples_per_s")
    if a is None or b is None or not b.median:
        return None
    return a.median / b.median
