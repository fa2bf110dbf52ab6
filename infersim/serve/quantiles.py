"""Latency samples in bounded memory: exact up to EXACT_LIMIT samples, then a relative-error sketch.

A serving run keeps, per stage, the TTFT, TPOT, E2E and queueing time of every finished request and
the inter-token gaps of every step. Stored as they are, they grow with the run (8 bytes a sample,
16 with a weight). `Samples` keeps them exactly while there are at most EXACT_LIMIT of them (the
percentiles are then numpy's linear interpolation, weighted ones the nearest rank by weight, as
before), and past that folds them into a logarithmic histogram (the DDSketch construction:
bucket i holds values in (gamma^(i-1), gamma^i] with gamma = (1 + a) / (1 - a), a = RELATIVE_ACCURACY,
and reports 2 gamma^i / (gamma + 1)): every percentile is then within a relative error of 0.5% of
a value that the exact nearest-rank percentile could take, whatever the run's length, in memory set
by the range of the values (about 230 buckets per decade, 2,500 from 1 us to 1e5 s) and not by
their number. Values at or below ZERO_BELOW seconds share one bucket reported as 0. Count,
mean and standard deviation are exact in both modes (running sums).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

from infersim.base.stats import percentile

EXACT_LIMIT = 100_000  # samples kept exactly; past it a Samples switches to the sketch
RELATIVE_ACCURACY = 0.005  # the sketch's relative error on any percentile
ZERO_BELOW = 1e-12  # seconds: values at or below share the zero bucket
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_INV_LOG_GAMMA = 1.0 / math.log(_GAMMA)


class Samples:
    """Non-negative samples (seconds), optionally weighted by a whole number (tokens). Adding one is
    an append while they are exact; count, sums and extremes are taken from the values then, and
    kept as running sums once they are folded into the sketch."""

    __slots__ = ("values", "weights", "buckets", "zero", "_count", "_weight", "_total", "_total_sq", "_minimum",
                 "_maximum")

    def __init__(self, weighted: bool = False) -> None:
        self.values: array | None = array("d")
        self.weights: array | None = array("q") if weighted else None  # else created at the first weight other than 1
        self.buckets: dict[int, int] | None = None  # the sketch, once past EXACT_LIMIT
        self.zero = 0
        self._count = 0  # of the samples folded into the sketch
        self._weight = 0
        self._total = 0.0
        self._total_sq = 0.0
        self._minimum = math.inf
        self._maximum = -math.inf

    def add(self, value: float, weight: int = 1) -> None:
        values = self.values
        if values is None:
            self._fold(value, weight)
            return
        values.append(value)
        if weight != 1 or self.weights is not None:
            if self.weights is None:
                self.weights = array("q", [1]) * (len(values) - 1)
            self.weights.append(weight)
        if len(values) > EXACT_LIMIT:
            self._to_sketch()

    def _fold(self, value: float, weight: int) -> None:
        self._count += 1
        self._weight += weight
        self._total += value * weight
        self._total_sq += value * value * weight
        if value < self._minimum:
            self._minimum = value
        if value > self._maximum:
            self._maximum = value
        if value <= ZERO_BELOW:
            self.zero += weight
            return
        index = math.ceil(math.log(value) * _INV_LOG_GAMMA)
        buckets = self.buckets
        assert buckets is not None
        buckets[index] = buckets.get(index, 0) + weight

    def _to_sketch(self) -> None:
        values, weights = self.values, self.weights
        self.values = self.weights = None
        self.buckets = {}
        assert values is not None
        for i, value in enumerate(values):
            self._fold(value, weights[i] if weights is not None else 1)

    def _pairs(self) -> list[tuple[float, int]]:
        assert self.values is not None
        if self.weights is None:
            return [(v, 1) for v in self.values]
        return list(zip(self.values, self.weights))

    @property
    def exact(self) -> bool:
        return self.values is not None

    @property
    def count(self) -> int:
        return len(self.values) if self.values is not None else self._count

    @property
    def weight(self) -> int:
        if self.values is None:
            return self._weight
        return sum(self.weights) if self.weights is not None else len(self.values)

    @property
    def total(self) -> float:
        if self.values is None:
            return self._total
        return sum(self.values) if self.weights is None else sum(v * w for v, w in self._pairs())

    @property
    def mean(self) -> float:
        weight = self.weight
        return self.total / weight if weight else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation (numpy's default)."""
        weight = self.weight
        if not weight:
            return 0.0
        mean = self.mean
        if self.values is None:
            return math.sqrt(max(0.0, self._total_sq / weight - mean * mean))
        if self.weights is None:
            return math.sqrt(sum((v - mean) ** 2 for v in self.values) / weight)
        return math.sqrt(sum(w * (v - mean) ** 2 for v, w in zip(self.values, self.weights)) / weight)

    @property
    def maximum(self) -> float:
        if self.values is None:
            return self._maximum
        return max(self.values) if self.values else -math.inf

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100); 0.0 for no samples."""
        return self.percentiles((q,))[0]

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """The qs-th percentiles (each as `percentile`), the samples sorted once for all of them."""
        if not self.count:
            return [0.0 for _q in qs]
        if self.values is not None:
            if self.weights is None:
                ordered = sorted(self.values)
                return [percentile(ordered, q) for q in qs]
            pairs = sorted(self._pairs())
            return [_weighted_nearest_rank(pairs, q) for q in qs]
        return [self._sketch_percentile(q) for q in qs]

    def _sketch_percentile(self, q: float) -> float:
        buckets = self.buckets
        assert buckets is not None
        unweighted = self._weight == self._count
        # the rank linear interpolation starts from for unweighted samples, the weight reached for weighted ones
        target = q / 100 * (self._count - 1) if unweighted else q / 100 * self._weight
        seen = self.zero
        if (seen > target) if unweighted else (seen >= target and seen > 0):
            return 0.0
        for index in sorted(buckets):
            seen += buckets[index]
            if (seen > target) if unweighted else seen >= target:
                return min(self._maximum, max(self._minimum, 2 * _GAMMA ** index / (_GAMMA + 1)))
        return self._maximum

    def merge(self, other: Samples) -> None:
        """Add `other`'s samples to these."""
        if other.values is not None and self.values is not None and \
                len(self.values) + len(other.values) <= EXACT_LIMIT:  # both stay exact: add them at once
            self._extend(other.values, other.weights)
            return
        if other.values is not None:
            weights = other.weights
            for i, value in enumerate(other.values):
                self.add(value, weights[i] if weights is not None else 1)
            return
        if self.values is not None:
            self._to_sketch()
        assert other.buckets is not None and self.buckets is not None
        for index, weight in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + weight
        self.zero += other.zero
        self._count += other._count
        self._weight += other._weight
        self._total += other._total
        self._total_sq += other._total_sq
        self._minimum = min(self._minimum, other._minimum)
        self._maximum = max(self._maximum, other._maximum)

    def _extend(self, values: array, weights: array | None) -> None:
        """Append exact samples as `add` would one by one (no sketch is reached)."""
        assert self.values is not None
        if self.weights is None and weights is not None and any(w != 1 for w in weights):
            self.weights = array("q", [1]) * len(self.values)
        if self.weights is not None:
            self.weights.extend(weights if weights is not None else array("q", [1]) * len(values))
        self.values.extend(values)

    def memory_entries(self) -> int:
        """Stored entries (values or buckets): what the samples hold in memory."""
        return len(self.values) if self.values is not None else len(self.buckets or ())


def _weighted_nearest_rank(ordered: list[tuple[float, int]], q: float) -> float:
    """The nearest-rank q-th percentile by weight of (value, weight) pairs in ascending order."""
    total = sum(w for _v, w in ordered)
    if not total:
        return 0.0
    target = q / 100 * total
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen >= target:
            return value
    return ordered[-1][0]
