"""A calibrated run's headline numbers beside the uncalibrated ones, with the profile's held-out interval."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: (serving summary key, the profile's metric, label)
SERVING_HEADLINE = (("mean_ttft_ms", "ttft_mean_ms", "mean TTFT"), ("mean_itl_ms", "itl_mean_ms", "mean ITL"),
                    ("mean_e2el_ms", "e2e_mean_ms", "mean E2E"))


def headline_rows(profile: Any, calibrated: Mapping[str, Any], uncalibrated: Mapping[str, Any],
                  headline: tuple[tuple[str, str, str], ...]) -> list[dict[str, Any]]:
    rows = []
    for key, metric, label in headline:
        value, plain = calibrated.get(key), uncalibrated.get(key)
        if value is None or plain is None:
            continue
        row: dict[str, Any] = {"metric": key, "label": label, "calibrated": value, "uncalibrated": plain}
        interval = profile.interval(metric)
        if interval is not None:
            low, high, level = interval
            row.update({"interval_low": value * low, "interval_high": value * high, "interval_level": level})
        rows.append(row)
    return rows


def block(profile: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"profile": profile.source, "applies_to": {"hardware": profile.hardware, "engine": profile.engine,
                                                      "engine_version": profile.engine_version},
            "constants": {c.name: {"value": c.value, "uncertainty": c.uncertainty, "prior": c.prior}
                          for c in profile.constants},
            "headline": rows}


#: (run report key, the profile's metric, label): one request's TTFT and the decode step's TPOT,
#: with the interval of the profile's serving runs' mean TTFT and ITL
RUN_HEADLINE = (("single_request_ttft_ms", "ttft_mean_ms", "TTFT"), ("tpot_ms", "itl_mean_ms", "TPOT"))


def _run_figures(data: Mapping[str, Any]) -> dict[str, Any]:
    prefill, decode = data.get("prefill") or {}, data.get("decode") or {}
    return {"single_request_ttft_ms": prefill.get("single_request_ttft_ms"), "tpot_ms": decode.get("tpot_ms")}


def run_beside(profile: Any, data: Mapping[str, Any], plain: Mapping[str, Any]) -> dict[str, Any]:
    """The calibration block of a plain run's report (`data`, `plain`: the JSON form of the run on
    calibrated and on uncalibrated cards)."""
    return block(profile, headline_rows(profile, _run_figures(data), _run_figures(plain), RUN_HEADLINE))


def serving_beside(config: Any, options: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The calibration block of a serving run's summary: the same run on the uncalibrated cards
    beside it (None when the run has no calibration)."""
    if config.calibration is None:
        return None
    from infersim.run.config import without_calibration
    from infersim.serve.api import simulate_serving

    plain = simulate_serving(without_calibration(config), {**options, "requests": False})
    return block(config.calibration, headline_rows(config.calibration, summary, plain, SERVING_HEADLINE))


def beside_text(calibration: Mapping[str, Any]) -> str:
    from infersim.cards.calibration import CONSTANT_BY_NAME, format_value

    fitted = ", ".join(f"{name} {format_value(CONSTANT_BY_NAME[name], c['value'])}"
                       for name, c in calibration["constants"].items())
    lines = [f"CALIBRATION  {calibration['profile']} ({fitted or 'no constant fitted: the cards stand'})"]
    for row in calibration["headline"]:
        interval = (f"   {row['interval_level']:.0%} interval {row['interval_low']:,.2f} .. {row['interval_high']:,.2f}"
                    if "interval_low" in row else "")
        lines.append(f"  {row['label']:<10} {row['calibrated']:>10,.2f} ms calibrated, {row['uncalibrated']:>10,.2f} "
                     f"ms on the cards{interval}")
    if any("interval_low" in row for row in calibration["headline"]):
        lines.append("  interval: where the measured value fell around held-out predictions of the profile's own runs")
    return "\n".join(lines)
