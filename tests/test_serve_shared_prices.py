"""Step prices shared between serving runs (infersim.serve.cost.StepPriceBook) and the latency
summaries' one-sort percentiles: the same numbers as each run alone, fewer stage-engine evaluations."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.cards.deployment import Workload
from infersim.run.config import config_from_mapping
from infersim.serve.api import simulate_serving
from infersim.serve.cost import StepCoster, StepPriceBook, StepPricing
from infersim.serve.quantiles import EXACT_LIMIT, Samples

FP8 = {"gemm": "fp8", "weights": "fp8", "kv_cache": "fp8"}
OFFLINE = {"mode": "offline", "num_requests": 300, "isl": 1000, "osl": 200}
POISSON = {"mode": "poisson", "rate": 6, "num_requests": 200, "isl": {"dist": "lognormal", "mean": 1500, "std": 600},
           "osl": {"dist": "uniform", "min": 20, "max": 400}}


@cache
def _loaded(tp: int):
    return config_from_mapping({
        "model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "sglang",
        "deployment": {"num_gpus": tp, "attention": {"tp": tp}, "ffn": {"tp": tp}, "precision": FP8},
        "workload": {"isl": 1000, "osl": 200}}, "test", mfu_tables="none")  # roofline: one NoTables object per run


@cache
def config(tp: int = 1, isl: int = 1000):
    """The run on `tp` GPUs; another isl keeps its cards and table set, as runs of one validation do."""
    loaded = _loaded(tp)
    return loaded if isl == 1000 else replace(loaded, workload=Workload(isl=isl, osl=200))


def test_runs_sharing_a_book_report_what_each_reports_alone():
    slower = {**POISSON, "rate": 4}
    alone = [simulate_serving(config(), POISSON), simulate_serving(config(isl=3000), slower)]
    book = StepPriceBook()
    shared = [simulate_serving(config(), POISSON, book), simulate_serving(config(isl=3000), slower, book)]
    assert shared == alone  # every number, the shapes each run priced included
    prices = book.prices(StepPricing.of(config(), 1.04))
    priced = sum(run["pools"][0]["priced_step_shapes"] for run in alone)
    assert 0 < len(prices.steps) < priced  # the second run found some of its shapes priced


def test_a_run_repeated_on_a_book_evaluates_no_step_again():
    book = StepPriceBook()
    first = simulate_serving(config(), OFFLINE, book)
    prices = book.prices(StepPricing.of(config(), 1.04))
    evaluated = len(prices.by_arguments)
    assert 0 < evaluated <= first["pools"][0]["priced_step_shapes"]
    again = simulate_serving(config(), OFFLINE, book)
    assert again == first
    assert len(prices.by_arguments) == evaluated


def test_the_pricing_record_is_what_the_step_price_reads():
    base = config()
    assert StepPricing.of(base, 1.04) == StepPricing.of(config(isl=3000), 1.04)  # the workload is not read
    assert StepPricing.of(base, 1.04) != StepPricing.of(config(tp=2), 1.04)
    assert StepPricing.of(base, 1.04) != StepPricing.of(base, 1.02)
    book = StepPriceBook()
    assert book.prices(StepPricing.of(base, 1.04)) is book.prices(StepPricing.of(config(isl=3000), 1.04))
    assert book.prices(StepPricing.of(base, 1.04)) is not book.prices(StepPricing.of(config(tp=2), 1.04))


def test_speculative_pricing_keeps_the_workload_its_lookahead_reads():
    spec = replace(config(), speculative=object())  # any section: the whole run is the record's
    assert StepPricing.of(spec, 1.04).speculative_run is spec
    other = replace(spec, workload=Workload(isl=3000, osl=200))
    assert StepPricing.of(spec, 1.04) != StepPricing.of(other, 1.04)


def test_shapes_that_give_the_stage_engine_the_same_arguments_are_evaluated_once():
    # TP 2: 17 and 18 decode requests are 9 per GPU either way, and pad to the same graph
    coster = StepCoster(config(tp=2))
    assert coster.bucket(17) != coster.bucket(18)
    a = coster.cost_energy(17, 17 * 800.0, 0, 0, 0.0)
    b = coster.cost_energy(18, 18 * 800.0, 0, 0, 0.0)
    assert a == b
    assert coster.priced == 2
    assert len(coster._by_arguments) == 1
    alone = StepCoster(config(tp=2))
    assert alone.cost_energy(18, 18 * 800.0, 0, 0, 0.0) == b


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=60),
       weights=st.one_of(st.none(), st.lists(st.integers(1, 5), min_size=60, max_size=60)),
       extra=st.lists(st.floats(0, 100), max_size=3))
def test_percentiles_sorted_once_are_each_percentile(values, weights, extra):
    samples = Samples(weighted=weights is not None)
    for i, value in enumerate(values):
        samples.add(value, weights[i] if weights is not None else 1)
    qs = (50, 90, 99, *extra)
    assert samples.percentiles(qs) == [samples.percentile(q) for q in qs]
    assert Samples().percentiles(qs) == [0.0] * len(qs)


@settings(max_examples=40, deadline=None)
@given(first=st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(1, 3)), max_size=40),
       second=st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.integers(1, 3)), max_size=40),
       weighted=st.booleans())
def test_merging_exact_samples_at_once_equals_adding_them_one_by_one(first, second, weighted):
    def filled(pairs):
        s = Samples(weighted=weighted)
        for value, weight in pairs:
            s.add(value, weight if weighted else 1)
        return s

    merged, one_by_one = filled(first), filled(first)
    merged.merge(filled(second))
    for value, weight in second:
        one_by_one.add(value, weight if weighted else 1)
    assert merged.values == one_by_one.values
    assert merged.weights == one_by_one.weights
    assert merged.percentiles((50, 99)) == one_by_one.percentiles((50, 99))


def test_merging_past_the_exact_limit_folds_as_adding_one_by_one():
    rng = random.Random(3)
    big = [rng.random() for _ in range(EXACT_LIMIT - 5)]
    tail = [rng.random() for _ in range(20)]
    merged, one_by_one, other = Samples(), Samples(), Samples()
    for value in big:
        merged.add(value)
        one_by_one.add(value)
    for value in tail:
        other.add(value)
        one_by_one.add(value)
    merged.merge(other)
    assert merged.values is None and one_by_one.values is None
    assert merged.buckets == one_by_one.buckets
    assert (merged.mean, merged.std, merged.percentile(99)) == (one_by_one.mean, one_by_one.std, one_by_one.percentile(99))
