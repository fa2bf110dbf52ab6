"""Searches over the request rate: a rate sweep (the throughput-latency curve) and the highest rate
that meets an SLO. Runs go to the sweep executor of `infersim.sweep.runner` (local worker processes
or any concurrent.futures.Executor, e.g. Dask's) and report progress on stderr.

SLO met at a rate: the `percentile` (default 99, as MLPerf Server) of TTFT is within the TTFT
limit and that of TPOT within the TPOT limit. The highest such rate is bracketed between a rate
far below capacity (1/100 of the offline max-load request throughput, which must meet the SLO, or
no rate does) and the offline throughput (no open-loop rate above it is sustained), then narrowed
by rounds of `probes` rates spread evenly inside the bracket, evaluated in parallel (probes = 1
is plain bisection), until the bracket is within `tolerance` of its top.
"""

from __future__ import annotations

import concurrent.futures as cf
import pickle
import sys
from collections.abc import Callable
from typing import IO, Any

from infersim.cards.schema import check_number
from infersim.run.config import RunConfig
from infersim.base.workers import available_cpus, pool_workers, stop_pool, worker_pool
from infersim.base.errors import ConfigError, InferSimError, NotPossible, echo
from infersim.serve.api import simulate_serving
from infersim.serve.metrics import percentile_key


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while rates were running: the runs that finished, by rate."""

    def __init__(self, finished: list[tuple[float | None, dict[str, Any]]], by: str) -> None:
        super().__init__(by)
        self.finished = finished
        self.by = by  # "SIGINT" or "SIGTERM"


def _serve_task(payload: bytes, rate: float | None) -> dict[str, Any]:
    config, options = pickle.loads(payload)
    if rate is not None:
        options = {**options, "mode": "poisson", "rate": rate}
    return simulate_serving(config, options)


class RateRunner:
    """Runs serving simulations of one config at several rates, in process or on an executor."""

    def __init__(self, config: RunConfig, options: dict[str, Any], executor: cf.Executor | None = None,
                 workers: int | None = None, progress: bool | None = None, stream: IO[str] | None = None) -> None:
        if workers is not None and workers < 1:
            raise InferSimError(f"--workers must be at least 1 (got {workers})")
        self.payload = pickle.dumps((config, options), protocol=pickle.HIGHEST_PROTOCOL)
        self.executor = executor
        self.workers, cut = pool_workers(workers, MAX_RATES) if executor is None else (workers or available_cpus(), "")
        if cut:
            (stream or sys.stderr).write(f"infersim: {cut}\n")
        self.progress = progress
        self.stream = stream
        self.pool: cf.Executor | None = None

    def __enter__(self) -> RateRunner:
        if self.executor is None and self.workers > 1:
            self.pool = worker_pool(self.workers)
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.pool is None:
            return
        if kind is None:
            self.pool.shutdown(cancel_futures=True)
        else:  # interrupted or failed: the workers' runs are of no use any more
            stop_pool(self.pool)

    def run(self, rates: list[float | None], label: str = "runs") -> list[dict[str, Any]]:
        from infersim.sweep.runner import Progress

        bar = Progress(len(rates), self.stream, self.progress, delay_s=0.0, unit=label)
        results: list[dict[str, Any] | None] = [None] * len(rates)
        pool = self.executor or self.pool
        done = 0
        try:
            if pool is None or len(rates) == 1:
                for i, rate in enumerate(rates):
                    results[i] = _serve_task(self.payload, rate)
                    done += 1
                    bar.update(done, done, force=True)
            else:
                futures = {pool.submit(_serve_task, self.payload, rate): i for i, rate in enumerate(rates)}
                for future in cf.as_completed(futures):
                    results[futures[future]] = future.result()
                    done += 1
                    bar.update(done, done, force=True)
        except KeyboardInterrupt as exc:
            from infersim.sweep.runner import Terminated

            if self.pool is not None:  # its runs in flight are of no use now: end them at once
                stop_pool(self.pool)
                self.pool = None
            finished = [(rate, r) for rate, r in zip(rates, results) if r is not None]
            raise RunInterrupted(finished, "SIGTERM" if isinstance(exc, Terminated) else "SIGINT") from None
        finally:
            bar.close()
        return [r for r in results if r is not None]


#: most rates one --rate-sweep runs (each rate is a whole serving simulation)
MAX_RATES = 1000


def parse_rate_range(text: str) -> list[float]:
    """'1:16:1' (start:stop:step, stop included), or 'a,b,c'."""
    try:
        if ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) != 3:
                raise ValueError
            start, stop, step = parts
            if step <= 0 or stop < start:
                raise InferSimError(f"--rate-sweep {text}: needs start <= stop and step > 0")
            for value in (start, stop, step):
                check_number(value, "--rate-sweep", "", gt=0)
            count = int(round((stop - start) / step)) + 1
            if count > MAX_RATES:
                raise InferSimError(f"--rate-sweep {text}: {count:.3g} rates, at most {MAX_RATES:,} (each is a whole "
                                    "serving run); widen the step")
            rates = [float(f"{start + i * step:.9g}") for i in range(count) if start + i * step <= stop * (1 + 1e-9)]
        else:
            rates = [float(check_number(p.strip(), "--rate-sweep", "", gt=0)) for p in text.split(",") if p.strip()]
            if len(rates) > MAX_RATES:
                raise InferSimError(f"--rate-sweep: {len(rates):,} rates, at most {MAX_RATES:,} (each is a whole "
                                    "serving run)")
    except ConfigError as exc:
        raise InferSimError(f"--rate-sweep {echo(text)}: {exc.problem}") from None
    except ValueError:
        raise InferSimError(f"--rate-sweep {text!r}: expected start:stop:step (e.g. 1:16:1) or a list 2,4,8") from None
    if not rates or any(r <= 0 for r in rates):
        raise InferSimError(f"--rate-sweep {text!r}: rates must be > 0 requests/s")
    return rates


def rate_sweep(runner: RateRunner, rates: list[float]) -> list[dict[str, Any]]:
    rows = runner.run(list(rates), "rates")
    if rows and all(_all_rejected(row) for row in rows):
        _refuse_all_rejected(rows[0], "--rate-sweep")
    return [{"rate": rate, **row} for rate, row in zip(rates, rows)]


def _all_rejected(summary: dict[str, Any]) -> bool:
    return summary["num_prompts"] > 0 and summary.get("rejected", 0) == summary["num_prompts"]


def _refuse_all_rejected(summary: dict[str, Any], search: str) -> None:
    """A search whose every request the server rejects on arrival has nothing to measure at any rate."""
    longer = summary.get("rejected_as_longer_than")
    why = f" as longer (prompt + output) than {longer}" if longer else ""
    raise NotPossible(f"{search}: at any rate, every one of the {summary['num_prompts']:,} requests is rejected on "
                      f"arrival{why}: no rate serves a request; give shorter requests (--isl/--osl) or a longer "
                      "--max-model-len")


def rejected_at(summary: dict[str, Any]) -> int:
    """Requests a run rejected on arrival (longer than the server admits)."""
    return int(summary.get("rejected", 0))


def slo_met(summary: dict[str, Any], ttft_s: float | None, tpot_s: float | None, percentile: float) -> bool:
    key = percentile_key(percentile)
    if ttft_s is not None and summary[f"{key}_ttft_ms"] > ttft_s * 1e3:
        return False
    return not (tpot_s is not None and summary[f"{key}_tpot_ms"] > tpot_s * 1e3)


def max_rate_under_slo(runner: RateRunner, offline_summary: dict[str, Any], ttft_s: float | None,
                       tpot_s: float | None, percentile: float = 99, tolerance: float = 0.02, probes: int | None = None,
                       max_rounds: int = 12, note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The highest Poisson rate whose `percentile` TTFT and TPOT meet the limits (see module docstring).
    Returns {"max_rate", "summary" (at that rate), "probes": [{"rate", "met", p.._ttft_ms, p.._tpot_ms, num_prompts,
    rejected}]}, and "rejected_as_longer_than" where the server rejects some requests on arrival."""
    if ttft_s is None and tpot_s is None:
        raise InferSimError("--max-rate-under-slo needs an SLO: --slo ttft=2s,tpot=50ms")
    if not 0 < percentile < 100:
        raise InferSimError(f"SLO percentile must be in (0, 100) (got {percentile:g})")
    key = percentile_key(percentile)
    if _all_rejected(offline_summary):
        _refuse_all_rejected(offline_summary, "--max-rate-under-slo")
    capacity = offline_summary["request_throughput"]
    lo, hi = capacity / 100, capacity
    history: list[dict[str, Any]] = []

    def record(rate: float, row: dict[str, Any]) -> bool:
        met = slo_met(row, ttft_s, tpot_s, percentile)
        history.append({"rate": rate, "met": met, f"{key}_ttft_ms": row[f"{key}_ttft_ms"],
                        f"{key}_tpot_ms": row[f"{key}_tpot_ms"], "num_prompts": row["num_prompts"],
                        "rejected": rejected_at(row)})
        return met

    def probe(rates: list[float]) -> list[tuple[float, bool, dict[str, Any]]]:
        try:
            rows = runner.run(rates, "rates")
        except RunInterrupted as exc:
            for rate, row in exc.finished:
                record(float(rate or 0.0), row)  # the rates of this round that finished count too
            raise
        return [(rate, record(rate, row), row) for rate, row in zip(rates, rows)]

    longer = offline_summary.get("rejected_as_longer_than")
    try:
        found = _search_rate(probe, runner, lo, hi, key, ttft_s, tpot_s, capacity, percentile, history, tolerance,
                            probes, max_rounds, note)
        if longer:
            found["rejected_as_longer_than"] = longer
        return found
    except RunInterrupted as exc:
        met = [h for h in history if h["met"]]
        failed = [h["rate"] for h in history if not h["met"]]
        best_rate = max((h["rate"] for h in met), default=None)
        return {"max_rate": best_rate, "summary": None, "capacity_rate": capacity, "percentile": percentile,
                "probes": sorted(history, key=lambda h: h["rate"]), "interrupted": exc.by,
                "below": min((r for r in failed if best_rate is None or r > best_rate), default=None)}


def _search_rate(probe: Callable[[list[float]], list[tuple[float, bool, dict[str, Any]]]], runner: RateRunner,
                 lo: float, hi: float, key: str, ttft_s: float | None, tpot_s: float | None, capacity: float,
                 percentile: float, history: list[dict[str, Any]], tolerance: float, probes: int | None,
                 max_rounds: int, note: Callable[[str], None] | None) -> dict[str, Any]:
    """The bracketing search of max_rate_under_slo (see the module docstring)."""
    (_r, met_lo, best), (_r2, met_hi, top) = probe([lo, hi])
    if not met_lo:
        limits = []
        if ttft_s is not None:
            limits.append(f"{key} TTFT {best[f'{key}_ttft_ms']:.1f} ms (limit {ttft_s * 1e3:g} ms)")
        if tpot_s is not None:
            limits.append(f"{key} TPOT {best[f'{key}_tpot_ms']:.1f} ms (limit {tpot_s * 1e3:g} ms)")
        raise NotPossible(f"no request rate meets the SLO on this deployment: even at {lo:.3g} req/s "
                          f"(1/100 of its capacity) {' and '.join(limits)}")
    best_rate = lo
    if met_hi:
        best_rate, best = hi, top
    else:
        width = probes or max(1, runner.workers if runner.pool is not None or runner.executor else 1)
        for _round in range(max_rounds):
            if (hi - lo) <= tolerance * hi:
                break
            rates = [lo + (hi - lo) * (i + 1) / (width + 1) for i in range(width)]
            results = probe(rates)
            new_lo, new_hi = lo, hi
            for rate, met, row in results:
                if met and rate > new_lo:
                    new_lo, best_rate, best = rate, rate, row
            failing = [rate for rate, met, _row in results if not met and rate > new_lo]
            if failing:
                new_hi = min(failing)
            lo, hi = new_lo, new_hi
            if note:
                note(f"bracket {lo:.4g}..{hi:.4g} req/s")
    return {"max_rate": best_rate, "summary": best, "capacity_rate": capacity, "percentile": percentile,
            "probes": sorted(history, key=lambda h: h["rate"])}
