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

from infersim.stats import percentile

EXACT_LIMIT = 100_000  # samples kept exactly; past it a Samples switches to the sketch
RELATIVE_ACCURACY = 0.005  # the sketch's relative error on any percentile
ZERO_BELOW = 1e-12  # seconds: values at or below share the zero bucket
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_INV_LOG_GAMMA = 1.0 / math.log(_GAMMA)


class Samples:
    """Non-negative samples (seconds), optionally weighted by a whole number (tokens)."""

    __slots__ = ("values", "weights", "buckets", "zero", "count", "weight", "total", "total_sq", "minimum",
                 "maximum")

    def __init__(self) -> None:
        self.values: array | None = array("d")
        self.weights: array | None = None  # created at the first weight other than 1
        self.buckets: dict[int, int] | None = None  # the sketch, once past EXACT_LIMIT
        self.zero = 0
        self.count = 0  # samples added
        self.weight = 0  # their total weight
        self.total = 0.0  # weighted sum
        self.total_sq = 0.0  # weighted sum of squares
        self.minimum = math.inf
        self.maximum = -math.inf

    def add(self, value: float, weight: int = 1) -> None:
        self.count += 1
        self.weight += weight
        self.total += value * weight
        self.total_sq += value * value * weight
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value
        values = self.values
        if values is None:
            self._bucket(value, weight)
            return
        values.append(value)
        if weight != 1 or self.weights is not None:
            if self.weights is None:
                self.weights = array("q", [1]) * (len(values) - 1)
            self.weights.append(weight)
        if len(values) > EXACT_LIMIT:
            self._to_sketch()

    def _bucket(self, value: float, weight: int) -> None:
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
            self._bucket(value, weights[i] if weights is not None else 1)

    @property
    def exact(self) -> bool:
        return self.values is not None

    @property
    def mean(self) -> float:
        return self.total / self.weight if self.weight else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation (numpy's default)."""
        if not self.weight:
            return 0.0
        mean = self.mean
        return math.sqrt(max(0.0, self.total_sq / self.weight - mean * mean))

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100); 0.0 for no samples."""
        if not self.count:
            return 0.0
        if self.values is not None:
            if self.weights is None:
                return percentile(sorted(self.values), q)
            return _weighted_nearest_rank(list(zip(self.values, self.weights)), q)
        return self._sketch_percentile(q)

    def _sketch_percentile(self, q: float) -> float:
        buckets = self.buckets
        assert buckets is not None
        unweighted = self.weight == self.count
        # the rank linear interpolation starts from for unweighted samples, the weight reached for weighted ones
        target = q / 100 * (self.count - 1) if unweighted else q / 100 * self.weight
        seen = self.zero
        if (seen > target) if unweighted else (seen >= target and seen > 0):
            return 0.0
        for index in sorted(buckets):
            seen += buckets[index]
            if (seen > target) if unweighted else seen >= target:
                return min(self.maximum, max(self.minimum, 2 * _GAMMA ** index / (_GAMMA + 1)))
        return self.maximum

    def merge(self, other: Samples) -> None:
        """Add `other`'s samples to these."""
        if other.values is not None and self.values is not None:
            weights = other.weights
            for i, value in enumerate(other.values):
                self.add(value, weights[i] if weights is not None else 1)
            return
        if self.values is not None:
            self._to_sketch()
        if other.values is not None:
            weights = other.weights
            for i, value in enumerate(other.values):
                self._bucket(value, weights[i] if weights is not None else 1)
        else:
            assert other.buckets is not None and self.buckets is not None
            for index, weight in other.buckets.items():
                self.buckets[index] = self.buckets.get(index, 0) + weight
            self.zero += other.zero
        self.count += other.count
        self.weight += other.weight
        self.total += other.total
        self.total_sq += other.total_sq
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)

    def memory_entries(self) -> int:
        """Stored entries (values or buckets): what the samples hold in memory."""
        return len(self.values) if self.values is not None else len(self.buckets or ())


def _weighted_nearest_rank(samples: list[tuple[float, int]], q: float) -> float:
    ordered = sorted(samples)
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
