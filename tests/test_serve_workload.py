"""Serving workloads: seeded generators, length distributions, trace replay and its errors."""

from __future__ import annotations

import json

import pytest

from infersim.base.errors import InferSimError
from infersim.serve.trace_replay import load_trace
from infersim.serve.workload import length_dist, offline_requests, poisson_requests


def test_generators_are_seeded_and_reproducible():
    isl = length_dist({"dist": "lognormal", "mean": 1000, "std": 400}, "isl")
    osl = length_dist({"dist": "uniform", "min": 10, "max": 20}, "osl")
    a = poisson_requests(isl, osl, 200, 4.0, seed=7)
    b = poisson_requests(isl, osl, 200, 4.0, seed=7)
    c = poisson_requests(isl, osl, 200, 4.0, seed=8)
    assert a == b and a != c
    assert all(10 <= r.output_tokens <= 20 for r in a)
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)


def test_poisson_rate_and_lognormal_mean_come_out_as_asked():
    isl = length_dist({"dist": "lognormal", "mean": 1000, "std": 400}, "isl")
    reqs = poisson_requests(isl, length_dist(100, "osl"), 20000, 5.0, seed=1)
    assert reqs[-1].arrival_s / len(reqs) == pytest.approx(0.2, rel=0.03)
    mean = sum(r.input_tokens for r in reqs) / len(reqs)
    assert mean == pytest.approx(1000, rel=0.02)
    bursty = poisson_requests(isl, length_dist(100, "osl"), 20000, 5.0, seed=1, burstiness=0.25)
    assert bursty[-1].arrival_s / len(bursty) == pytest.approx(0.2, rel=0.06)


def test_offline_requests_all_arrive_at_zero():
    reqs = offline_requests(length_dist(128, "isl"), length_dist(64, "osl"), 5, seed=0)
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in reqs] == [(0.0, 128, 64)] * 5


@pytest.mark.parametrize("spec, message", [
    (-5, "whole number of tokens >= 1"),
    (0, "whole number of tokens >= 1"),
    ({"dist": "normal", "mean": 100}, "needs 'std'"),
    ({"dist": "zipf", "mean": 100}, "not one of"),
    ({"dist": "normal", "mean": 100, "std": -1}, "must be >= 0"),
    ({"dist": "uniform", "min": 10}, "needs 'min' and 'max'"),
])
def test_bad_lengths_get_one_clear_message(spec, message):
    with pytest.raises(InferSimError, match=message):
        length_dist(spec, "isl")


def test_rate_zero_is_refused():
    with pytest.raises(InferSimError, match="positive number of requests per second"):
        poisson_requests(length_dist(1, "isl"), length_dist(1, "osl"), 1, 0.0, seed=0)


def test_azure_trace_columns_are_read_as_they_are(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:47.0000000,879,20\n")
    reqs = load_trace(path)
    assert [(r.input_tokens, r.output_tokens) for r in reqs] == [(374, 44), (879, 20), (396, 109)]
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(47.0 - 46.68059, abs=1e-6)
    assert reqs[2].arrival_s == pytest.approx(50.995169 - 46.68059, abs=1e-6)


def test_jsonl_trace_with_shared_prefixes(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"arrival_s": 0.5 * i, "input_tokens": 100, "output_tokens": 5, "prefix_id": "sys", "prefix_tokens": 64}
            for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reqs = load_trace(path, time_scale=2.0)
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0]
    assert all(r.prefix_id == "sys" and r.prefix_tokens == 64 for r in reqs)


@pytest.mark.parametrize("body, message", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,5\n2.0,abc,5\n", "row 2, column ContextTokens: 'abc'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,5\n2.0,10,-3\n", "row 2, column GeneratedTokens: -3 tokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", "row 1, column TIMESTAMP: 'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,\n", "row 1, column GeneratedTokens: empty"),
    ("when,ContextTokens,GeneratedTokens\n1.0,10,5\n", "no column for arrival_s"),
])
def test_bad_trace_rows_name_the_row_and_column(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InferSimError, match=message):
        load_trace(path)


def test_lengths_drawn_from_a_trace_keep_its_pairs(tmp_path):
    from infersim.serve.trace_replay import lengths_from_trace

    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,7\n1,2000,300\n2,50,1\n")
    base = poisson_requests(length_dist(1, "isl"), length_dist(1, "osl"), 300, 2.0, seed=3)
    drawn = lengths_from_trace(base, path, seed=3)
    assert {(r.input_tokens, r.output_tokens) for r in drawn} == {(100, 7), (2000, 300), (50, 1)}
    assert [r.arrival_s for r in drawn] == [r.arrival_s for r in base]
    assert drawn == lengths_from_trace(base, path, seed=3)
