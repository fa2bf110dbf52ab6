"""Sweep execution: derived variants simulate exactly like loading the config with --set, invalid
variants are reported, every executor gives the same rows, an interrupt keeps finished work."""

from __future__ import annotations

import concurrent.futures as cf
import math

import pytest

from infersim.run.config import load_run_config
from infersim.base.errors import ConfigError
from infersim.run.simulate import simulate
from infersim.sweep import Search, SweepSpec, load_base, parse_grid, run_sweep
from infersim.sweep.evaluate import divisors
from infersim.sweep.runner import available_cpus

CONFIG = "qwen3-30b.yaml"
GRID = ["model.num_key_value_heads=2,4,3", "deployment.ffn.ep=1,4", "workload.decode_batch_per_gpu=8,64,max"]


@pytest.fixture(scope="module")
def base():
    return load_base(CONFIG)


@pytest.fixture(scope="module")
def spec(base):
    return SweepSpec(base, tuple(parse_grid(GRID)), prefill=True)


@pytest.fixture(scope="module")
def serial(spec):
    return run_sweep(spec, workers=1, progress=False)


def _overrides(spec, point):
    return [f"{a.path}={v}" for a, v in zip(spec.axes, spec.values(point))]


def test_rows_equal_simulate_with_the_same_overrides(spec, serial):
    assert serial.total_units == serial.finished_units == 18 and not serial.interrupted
    ok = [r for r in serial.rows if r.ok]
    assert len(ok) == 12  # 3 KV heads variants are invalid x 6
    for row in ok:
        result = simulate(load_run_config(CONFIG, _overrides(spec, row.point)))
        assert row.tpot_s == pytest.approx(result.decode.step_time_s, rel=1e-12)
        assert row.tgs == pytest.approx(result.decode.tgs, rel=1e-12)
        assert row.ttft_s == pytest.approx(result.single_request_ttft_s, rel=1e-12)
        assert row.prefill_step_s == pytest.approx(result.prefill.step_time_s, rel=1e-12)
        assert row.batch == result.decode.tokens_per_gpu
        assert row.max_batch == result.memory.max_batch_per_gpu
        assert row.fits == (result.memory.fits and row.batch <= result.memory.max_batch_per_gpu)
        assert row.weights_bytes == pytest.approx(result.memory.weights_bytes)
        assert (row.num_gpus, row.attn_dp, row.ffn_ep) == (4, 4, result.config.deployment.ffn.ep)
        assert 1e-3 < row.tpot_s < 0.5  # a real decode step of a 30B MoE on H20s
        assert row.user_tps == pytest.approx(1 / row.tpot_s)
        # H20 at $1.18125 per GPU-hour: cost per million tokens = price / (3600 * TGS) * 1e6
        assert row.price == pytest.approx(1.18125)
        assert row.cost_per_mtok == pytest.approx(1.18125 / (3600 * row.tgs) * 1e6)


def test_max_batch_is_the_memory_limit(spec, serial):
    for row in serial.rows:
        if row.ok and spec.values(row.point)[2] == "max":
            assert row.batch == row.max_batch and row.fits


def test_invalid_variants_are_reported_not_simulated(spec, serial):
    bad = [r for r in serial.rows if not r.ok]
    assert len(bad) == 6 and {spec.values(r.point)[0] for r in bad} == {3}
    assert all("num_key_value_heads" in r.status and "must divide num_attention_heads (32)" in r.status for r in bad)
    assert all(math.isnan(r.tpot_s) for r in bad)
    assert serial.rejected == 6
    with pytest.raises(ConfigError) as info:  # the loader rejects the same variant the same way
        load_run_config(CONFIG, ["model.num_key_value_heads=3"])
    assert bad[0].status == f"{info.value.field}: {info.value.problem}"


def test_layout_rejections_use_the_loader_messages(base):
    spec = SweepSpec(base, tuple(parse_grid(["deployment.ffn.ep=3,4", "deployment.attention.tp=1,3"])))
    rows = run_sweep(spec, workers=1).rows
    status = {tuple(spec.values(r.point)): r.status for r in rows}
    assert status[(4, 1)] == ""
    assert status[(3, 1)] == "deployment.ffn: tp x ep = 3 does not divide the 4 GPUs of a pipeline stage (num_gpus 4 / pp 1)"
    for values, problem in status.items():
        if problem:  # the loader rejects the same variant with the same problem
            with pytest.raises(ConfigError) as info:
                load_run_config(CONFIG, [f"deployment.ffn.ep={values[0]}", f"deployment.attention.tp={values[1]}",
                                         "deployment.attention.dp=0", "deployment.ffn.dp=0"])
            assert problem == f"{info.value.field}: {info.value.problem}"


def test_whole_cards_and_card_fields_vary(base):
    spec = SweepSpec(base, tuple(parse_grid(["hardware=h20,h800", "hardware.peak.hbm_bandwidth=2e12,4e12"])))
    rows = run_sweep(spec, workers=1).rows
    assert all(r.ok for r in rows) and len(rows) == 4
    by = {spec.values(r.point): r for r in rows}
    for hw in ("h20", "h800"):
        ref = simulate(load_run_config(CONFIG, [f"hardware={hw}", "hardware.peak.hbm_bandwidth=2e12"]))
        assert by[(hw, 2e12)].tpot_s == pytest.approx(ref.decode.step_time_s, rel=1e-12)
        assert by[(hw, 4e12)].tpot_s < by[(hw, 2e12)].tpot_s  # more bandwidth, faster decode
    assert by[("h800", 2e12)].price == pytest.approx(2.10)


def test_set_overrides_reach_cards_loaded_by_the_grid():
    base = load_base(CONFIG, ["model.num_key_value_heads=2"])
    spec = SweepSpec(base, tuple(parse_grid(["model=qwen3-30b-a3b"])))
    (row,) = run_sweep(spec, workers=1).rows
    ref = simulate(load_run_config(CONFIG, ["model.num_key_value_heads=2"]))
    assert row.tpot_s == pytest.approx(ref.decode.step_time_s, rel=1e-12)


def test_layout_search_rows_are_valid_and_fit(base):
    search = Search(gpus=(1, 2, 4, 8, 16), batches=(1, 16, 256), max_pp=2)
    spec = SweepSpec(base, search=search)
    result = run_sweep(spec, workers=1)
    ok = [r for r in result.rows if r.ok]
    assert ok and len(ok) == len(result.rows)
    assert {r.num_gpus for r in ok} == {1, 2, 4, 8, 16}
    for r in ok:
        per_stage = r.num_gpus // r.pp
        assert r.attn_tp * r.attn_dp == per_stage and r.ffn_tp * r.ffn_ep * r.ffn_dp == per_stage
        assert r.fits and 1 <= r.batch <= r.max_batch
        assert r.batch in search.batches or r.batch == r.max_batch
        assert r.num_nodes == max(1, r.num_gpus // 8)
    assert result.rejected > 0 and any("tp x ep smaller than attention.tp" in p for p in result.problems)
    # expert-TP layouts are searched with the only token movement that serves them
    assert any(r.ffn_tp > 1 for r in ok)
    # spot-check one searched point against the full simulator
    r = max(ok, key=lambda r: r.tgs)
    ref = simulate(load_run_config(CONFIG, [
        f"deployment.num_gpus={r.num_gpus}", f"deployment.num_nodes={r.num_nodes}", f"deployment.pp={r.pp}",
        f"deployment.attention.tp={r.attn_tp}", "deployment.attention.dp=0", f"deployment.ffn.tp={r.ffn_tp}",
        f"deployment.ffn.ep={r.ffn_ep}", "deployment.ffn.dp=0", f"workload.decode_batch_per_gpu={r.batch}",
        *(["deployment.moe_comm=all-gather"] if r.ffn_tp > 1 else [])]))
    assert r.tpot_s == pytest.approx(ref.decode.step_time_s, rel=1e-12)


def test_batches_beyond_memory_are_skipped_and_counted(base):
    # qwen3-30b-a3b in bf16 is ~61 GB of weights: one 96 GB H20 has KV room for tens of requests, not 1024
    spec = SweepSpec(base, search=Search(gpus=(1,), batches=(1, 1024), include_max_batch=False))
    result = run_sweep(spec, workers=1)
    assert {r.batch for r in result.rows} <= {1}
    assert result.unfit >= 1


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


def _key(rows):
    return [(r.point, r.num_gpus, r.pp, r.attn_tp, r.ffn_tp, r.ffn_ep, r.batch, r.tpot_s if r.ok else None, r.status)
            for r in rows]


def test_thread_and_process_executors_give_the_same_rows(spec, serial):
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        threaded = run_sweep(spec, executor=pool, chunk_units=2)
    assert _key(threaded.rows) == _key(serial.rows) and threaded.workers == 0
    processes = run_sweep(spec, workers=2, chunk_units=5)
    assert _key(processes.rows) == _key(serial.rows) and processes.workers == min(2, available_cpus())


def test_workers_beyond_the_cpus_and_the_chunks_are_not_started(spec, serial, monkeypatch):
    import io

    import infersim.base.workers as workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 2)
    assert workers.pool_workers(None, 10) == (2, "")
    assert workers.pool_workers(1, 10) == (1, "")
    assert workers.pool_workers(None, 1) == (1, "")  # the default: as many as there is work for, nothing to say
    assert workers.pool_workers(100_000, 1) == (1, "--workers 100000: 2 CPUs available here; 1 chunk of work to "
                                                   "share; 1 worker process started")
    assert workers.pool_workers(2, 1) == (1, "--workers 2: 1 chunk of work to share; 1 worker process started")
    assert workers.pool_workers(2, 2) == (2, "")
    assert workers.pool_workers(100_000, 10) == (2, "--workers 100000: 2 CPUs available here; 2 worker processes started")
    stream = io.StringIO()
    result = run_sweep(spec, workers=100_000, chunk_units=spec.units // 2 + 1, stream=stream, progress=False)
    assert _key(result.rows) == _key(serial.rows)
    assert result.workers == 2  # two chunks
    assert "--workers 100000: 2 CPUs available here; 2 worker processes started" in stream.getvalue()


def test_dask_local_cluster_gives_the_same_rows(spec, serial):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        result = run_sweep(spec, executor=client.get_executor(), chunk_units=4)
    assert _key(result.rows) == _key(serial.rows)


class _InterruptAfter(cf.Executor):
    """Runs chunks at once; the k-th result raises KeyboardInterrupt as Ctrl-C would."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.submitted = 0

    def submit(self, fn, *args, **kwargs):
        future: cf.Future = cf.Future()
        self.submitted += 1
        if self.submitted == self.k:
            future.set_exception(KeyboardInterrupt())
        else:
            future.set_result(fn(*args, **kwargs))
        return future


def test_interrupt_keeps_finished_chunks(spec, serial):
    result = run_sweep(spec, executor=_InterruptAfter(3), chunk_units=4)
    assert result.interrupted
    assert result.finished_units == result.total_units - 4  # one chunk of 4 lost, the others kept
    done = _key(result.rows)
    assert done and all(k in _key(serial.rows) for k in done)
