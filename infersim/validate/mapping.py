"""The mapping of reference points to runs (`points.yaml`): reading and checking it.

Every entry is checked on load (kind, the fields its kind needs, metric conversions, a `why`), so
a mistake in the mapping is one clear error naming the file, the entry and the field. Run configs
are kept as written; `fit_run_to_spec` drops the fields this build's run config does not know yet
(e.g. `engine` before engine cards exist), so the mapping can be written for the merged project.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from infersim.cards.schema import load_yaml
from infersim.base.errors import MISSING, ConfigError

KERNEL_KINDS = ("kernel_gemm", "kernel_grouped_gemm", "deepep")
STAGE_KINDS = ("stage_prefill", "stage_decode")
SERVING_KINDS = ("serving",)
# a run's energy (infersim.run.energy): its own family, kept out of the overall time statistics
ENERGY_KINDS = ("energy",)
# a server's memory as it reports it at start (its KV pool): its own family, kept out of the overall
# time statistics too
MEMORY_KINDS = ("memory",)
KINDS = KERNEL_KINDS + STAGE_KINDS + SERVING_KINDS + ENERGY_KINDS + MEMORY_KINDS

# Family of each kind, for the statistics "by kind".
FAMILY = {"kernel_gemm": "kernel", "kernel_grouped_gemm": "kernel", "deepep": "kernel",
          "stage_prefill": "stage", "stage_decode": "stage", "serving": "serving", "energy": "energy",
          "memory": "memory"}

# What a kernel result can be turned into (see Conversion).
KERNEL_FROM = ("time_us", "tflops", "gbps")
# What a stage result can be turned into: (stage, quantity).
STAGE_FROM = {"prefill.tgs": ("prefill", "tgs"), "prefill.ttft_ms": ("prefill", "ttft_ms"),
              "decode.tgs": ("decode", "tgs"), "decode.tpot_ms": ("decode", "tpot_ms")}
# What a run's energy can be turned into: the attributes of infersim.run.energy.RunEnergy.
ENERGY_FROM = {"energy.joules_per_output_token": "joules_per_output_token",
               "energy.decode_joules_per_token": "joules_per_decode_token",
               "energy.watts_per_gpu": "watts_per_gpu"}
# What a server's memory can be turned into: the KV pool vLLM reports at start, tokens
# (infersim.run.memory.reported_pool_tokens).
MEMORY_FROM = ("kv_pool_tokens",)

_ENTRY_KEYS = {"id", "kind", "hardware", "kernel", "run", "set", "serving", "metric", "metrics", "not_expressed",
               "why", "accepted_outlier"}
_CONVERSION_KEYS = {"from", "multiply", "bytes", "unit", "kernel", "why"}


@dataclass(frozen=True)
class Conversion:
    """How a run's result becomes one compared number.

    source: kernels: time_us (kernel time in us), tflops (shape FLOPs / time / 1e12), gbps
    (`bytes` or the shape's bytes / time / 1e9); stages: prefill.tgs, prefill.ttft_ms,
    decode.tgs, decode.tpot_ms; serving: a key of the serving simulator's result; memory: kv_pool_tokens.
    The value is multiplied by `multiply`. `kernel` (kernel kinds) overrides shape fields.
    """

    source: str
    multiply: float = 1.0
    bytes: float | None = None
    unit: str = ""
    kernel: dict[str, Any] = field(default_factory=dict)
    why: str = ""


@dataclass(frozen=True)
class PointMapping:
    """One entry of points.yaml."""

    id: str
    kind: str
    why: str
    metrics: dict[str, Conversion]  # sub-metric key -> conversion; "" for a scalar point
    hardware: str = ""
    kernel: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    serving: dict[str, Any] = field(default_factory=dict)
    not_expressed: str = ""
    # a point compared and listed, but kept out of the statistics, with the reason its own run gives
    # (never a reason to fit it)
    accepted_outlier: str = ""
    # FIELD=VALUE overrides of the run, as `--set` gives them on a command line: how a point states
    # the engine settings its run named (e.g. the CUDA-graph batch sizes of trtllm-bench's options)
    overrides: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        return FAMILY[self.kind]


def _why_text(value: Any, source: str, where: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return "; ".join(v.strip() for v in value)
    raise ConfigError(source, where, value if value is not None else MISSING,
                      "every entry needs a `why`: a sentence, or a list of sentences, for its modelling choices")


def _conversion(data: Any, kind: str, source: str, where: str) -> Conversion:
    if not isinstance(data, dict):
        raise ConfigError(source, where, data, "expected a mapping {from: ..., multiply: ..., unit: ...}")
    unknown = sorted(set(data) - _CONVERSION_KEYS)
    if unknown:
        raise ConfigError(source, f"{where}.{unknown[0]}", data[unknown[0]],
                          f"unknown key (known keys: {', '.join(sorted(_CONVERSION_KEYS))})")
    frm = data.get("from")
    if not isinstance(frm, str) or not frm:
        raise ConfigError(source, f"{where}.from", frm if frm is not None else MISSING, "names what the number is made from")
    if kind in KERNEL_KINDS and frm not in KERNEL_FROM:
        raise ConfigError(source, f"{where}.from", frm, f"a kernel point's number is one of {', '.join(KERNEL_FROM)}")
    if kind in STAGE_KINDS and frm not in STAGE_FROM:
        raise ConfigError(source, f"{where}.from", frm, f"a stage point's number is one of {', '.join(STAGE_FROM)}")
    if kind in ENERGY_KINDS and frm not in ENERGY_FROM:
        raise ConfigError(source, f"{where}.from", frm, f"an energy point's number is one of {', '.join(ENERGY_FROM)}")
    if kind in MEMORY_KINDS and frm not in MEMORY_FROM:
        raise ConfigError(source, f"{where}.from", frm, f"a memory point's number is one of {', '.join(MEMORY_FROM)}")
    if kind in STAGE_KINDS and STAGE_FROM[frm][0] != kind.split("_")[1]:
        raise ConfigError(source, f"{where}.from", frm, f"a {kind} point compares the {kind.split('_')[1]} stage")
    multiply = data.get("multiply", 1.0)
    if isinstance(multiply, bool) or not isinstance(multiply, (int, float)) or multiply <= 0:
        raise ConfigError(source, f"{where}.multiply", multiply, "expected a positive number")
    nbytes = data.get("bytes")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or nbytes <= 0):
        raise ConfigError(source, f"{where}.bytes", nbytes, "expected a positive number of bytes")
    if nbytes is not None and frm != "gbps":
        raise ConfigError(source, f"{where}.bytes", nbytes, "only a gbps conversion divides bytes by time")
    kernel = data.get("kernel", {})
    if not isinstance(kernel, dict) or (kernel and kind not in KERNEL_KINDS):
        raise ConfigError(source, f"{where}.kernel", kernel, "kernel fields (a mapping) only for kernel points")
    why = data.get("why", "")
    return Conversion(frm, float(multiply), float(nbytes) if nbytes is not None else None,
                      str(data.get("unit", "")), dict(kernel), str(why))


def _identity(data: Any, index: int, source: str) -> tuple[str, str, str]:
    """(point id, where it is in the file, kind) of an entry, its keys checked."""
    where = f"points[{index}]"
    if not isinstance(data, dict):
        raise ConfigError(source, where, data, "expected a mapping with id, kind, why and the run")
    pid = data.get("id")
    if not isinstance(pid, str) or not pid:
        raise ConfigError(source, f"{where}.id", pid if pid is not None else MISSING, "every entry needs a point id")
    where = f"points[{index}] ({pid})"
    unknown = sorted(set(map(str, data)) - _ENTRY_KEYS)
    if unknown:
        raise ConfigError(source, f"{where}.{unknown[0]}", data[unknown[0]],
                          f"unknown key (known keys: {', '.join(sorted(_ENTRY_KEYS))})")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ConfigError(source, f"{where}.kind", kind if kind is not None else MISSING,
                          f"expected one of {', '.join(KINDS)}")
    return pid, where, kind


def _reason(data: dict[str, Any], key: str, source: str, where: str) -> str:
    """An optional reason (not_expressed, accepted_outlier) as one line of text."""
    value = data.get(key) or ""
    if not isinstance(value, str):
        raise ConfigError(source, f"{where}.{key}", value, "expected the reason as text")
    return " ".join(value.split())


def _metrics(data: dict[str, Any], kind: str, source: str, where: str, not_expressed: str) -> dict[str, Conversion]:
    """The entry's conversions: `metric` (one number) or `metrics` (one per sub-metric)."""
    if "metric" in data and "metrics" in data:
        raise ConfigError(source, where, MISSING, "give `metric` (one number) or `metrics` (one per sub-metric), not both")
    metrics: dict[str, Conversion] = {}
    if "metric" in data:
        metrics[""] = _conversion(data["metric"], kind, source, f"{where}.metric")
    elif "metrics" in data:
        if not isinstance(data["metrics"], dict) or not data["metrics"]:
            raise ConfigError(source, f"{where}.metrics", data["metrics"], "expected a mapping of sub-metric -> conversion")
        for key, conv in data["metrics"].items():
            metrics[str(key)] = _conversion(conv, kind, source, f"{where}.metrics.{key}")
    elif not not_expressed:
        raise ConfigError(source, f"{where}.metric", MISSING, "says how the result becomes the point's number")
    return metrics


def _check_what_runs(kind: str, hardware: Any, kernel: Any, run: Any, serving: Any, source: str, where: str) -> None:
    """An expressed point names what it runs: a kernel point its GPU and shape, the others a run
    config (and a serving point its serving options)."""
    if kind in KERNEL_KINDS:
        if not isinstance(hardware, str) or not hardware:
            raise ConfigError(source, f"{where}.hardware", hardware or MISSING, "a kernel point names a hardware card")
        if not isinstance(kernel, dict) or not kernel:
            raise ConfigError(source, f"{where}.kernel", kernel or MISSING, "a kernel point gives its shape's fields")
        return
    if not isinstance(run, dict) or not run:
        raise ConfigError(source, f"{where}.run", run or MISSING, f"a {kind} point gives an inline run config")
    if kind in SERVING_KINDS and (not isinstance(serving, dict) or not serving):
        raise ConfigError(source, f"{where}.serving", serving or MISSING,
                          "a serving point gives the serving options (mode, num_requests, isl, osl, ...)")


def _overrides(data: dict[str, Any], kind: str, source: str, where: str) -> tuple[str, ...]:
    overrides = data.get("set", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise ConfigError(source, f"{where}.set", overrides, "expected a list of FIELD=VALUE overrides (as --set takes)")
    if overrides and kind in KERNEL_KINDS:
        raise ConfigError(source, f"{where}.set", overrides, "overrides apply to a run; a kernel point has none")
    return tuple(overrides)


def _entry(data: Any, index: int, source: str) -> PointMapping:
    pid, where, kind = _identity(data, index, source)
    why = _why_text(data.get("why"), source, f"{where}.why")
    not_expressed = _reason(data, "not_expressed", source, where)
    accepted = _reason(data, "accepted_outlier", source, where)
    metrics = _metrics(data, kind, source, where, not_expressed)
    hardware = data.get("hardware", "")
    kernel = data.get("kernel", {})
    run = data.get("run", {})
    serving = data.get("serving", {})
    if not not_expressed:
        _check_what_runs(kind, hardware, kernel, run, serving, source, where)
    for name, value in (("kernel", kernel), ("run", run), ("serving", serving)):
        if not isinstance(value, dict):
            raise ConfigError(source, f"{where}.{name}", value, "expected a mapping")
    overrides = _overrides(data, kind, source, where)
    return PointMapping(pid, kind, why, metrics, str(hardware or ""), dict(kernel), dict(run), dict(serving),
                        not_expressed, accepted, overrides)


def load_mapping(path: Path) -> dict[str, PointMapping]:
    """Read and check a points file; returns the entries by point id, in file order."""
    data = load_yaml(Path(path), "points file")
    source = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise ConfigError(source, "points", MISSING, "expected a mapping with a `points` list")
    out: dict[str, PointMapping] = {}
    for index, raw in enumerate(data["points"]):
        entry = _entry(raw, index, source)
        if entry.id in out:
            raise ConfigError(source, f"points[{index}].id", entry.id, "a second entry for the same point id")
        out[entry.id] = entry
    return out


# ---------------------------------------------------------------------------------------------
# Run configs written for the merged project


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (also inside X | None), or None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if get_origin(hint) in (typing.Union, types.UnionType):
        for arg in get_args(hint):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def _fit(data: dict[str, Any], cls: type, prefix: str, dropped: list[str]) -> dict[str, Any]:
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            dropped.append(dotted)
            continue
        inner = _dataclass_of(hints[key])
        if inner is not None and isinstance(value, dict):
            value = _fit(value, inner, f"{dotted}.", dropped)
        out[key] = value
    return out


def fit_run_to_spec(run: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The run config with the fields this build's RunSpec does not know removed (recursively
    through deployment, workload, speculative), and the dotted names of what was removed."""
    from infersim.run.config import RunSpec

    dropped: list[str] = []
    return _fit(run, RunSpec, "", dropped), dropped
