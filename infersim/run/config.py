"""Run configs: which model on which hardware, deployed how, serving what workload.

`load_run_config(path, overrides)` reads a run YAML, applies `--set a.b=c` overrides (which reach
into the model and hardware cards too: `model.num_key_value_heads=2`, `hardware.peak.hbm_bandwidth=5e12`),
resolves and validates the cards, and checks the parallel layout against them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from infersim.cards.engine import EngineCard, validate_engine
from infersim.cards.hardware import HardwareCard, validate_hardware
from infersim.cards.model import ModelCard, validate_model
from infersim.cards.power import Electricity
from infersim.cards.registry import resolve, resolve_card
from infersim.cards.schema import build, load_yaml, spec
from infersim.cards.deployment import (
    Deployment,
    Workload,
    complete_layout,
    draft_deployment,
    named_deployment_fields,
    with_checkpoint_precision,
    with_engine_defaults,
)
from infersim.base.plaindata import parse_flag_value
from infersim.base.records import evolve
from infersim.base.errors import MISSING, ConfigError, InferSimError, echo, shorten
from infersim.shapes.kernels import KernelTables, NoTables
from infersim.tables.libraries import KernelLibraries, restrict_to_libraries
from infersim.run.flags import RunFlags, base_mapping, fit_layout, flag_fields, refuse_layout_overrides, replicas_note

if TYPE_CHECKING:
    from infersim.cards.calibration import CalibrationProfile


@dataclass(frozen=True, kw_only=True)
class Speculative:
    """Speculative decoding: a drafter proposes `lookahead` tokens per step, the model verifies them
    in one forward of lookahead + 1 tokens per request (see infersim.run.speculative)."""

    method: Literal["draft", "mtp"] = spec(
        doc="draft: a smaller model (draft_model) proposes the tokens; mtp: the model's own multi-token-prediction "
            "layers (num_nextn_predict_layers) do")
    draft_model: str | dict[str, Any] | None = spec(
        None, doc="method draft: bundled model card name, path or inline card of the draft model (same vocabulary)")
    lookahead: int | Literal["auto"] = spec(
        3, doc="tokens proposed per step k; auto = the k in 1..max_lookahead with the lowest TPOT", gt=0)
    acceptance_rate: float = spec(doc="probability that each proposed token is accepted (i.i.d. per token)", ge=0, le=1)
    max_lookahead: int = spec(8, doc="largest k that lookahead: auto tries (at most 64)", gt=0, le=64)


DEFAULT_ENGINE = "sglang@0.5"  # the engine the published calibration cases and the bundled examples were measured with

@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """The run YAML as written: cards by name or path."""

    model: str | dict[str, Any] = spec(doc="bundled model card name, path to a card YAML or HF config.json, or an inline card")
    hardware: str | dict[str, Any] = spec(doc="bundled hardware card name, path to a card YAML, or an inline card")
    engine: str | dict[str, Any] = spec(
        DEFAULT_ENGINE, doc="serving engine card (sglang, vllm, trtllm, huggingface): bundled name, path or inline card")
    deployment: Deployment = spec(doc="parallel layout, precision, overlap")
    workload: Workload = spec(doc="sequence lengths and batch")
    mfu_tables: str | None = spec(
        None, doc="directory of measured kernel tables; default (or auto): the bundled tables of the hardware card's "
                  "device for the engine's framework when there are any; none: roofline only")
    speculative: Speculative | None = spec(None, doc="speculative decoding (default: none)")
    kernel_libraries: KernelLibraries = spec(
        default_factory=KernelLibraries, doc="the library the engine runs per kernel family, where it differs from "
                                             "what the kernel tables measured: such tables are not used (roofline)")
    energy: Electricity = spec(default_factory=Electricity,
                               doc="what energy costs: electricity price and PUE (docs/energy.md)")
    calibration: str | None = spec(
        None, doc="calibration profile (`infersim calibrate --out`): constants of this GPU and engine fitted to "
                  "measured runs, set on the cards (docs/calibration.md)")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a simulation needs, validated."""

    model: ModelCard
    hardware: HardwareCard
    deployment: Deployment
    workload: Workload
    tables: KernelTables
    engine: EngineCard
    source: str = ""
    model_source: str = ""
    hardware_source: str = ""
    tables_source: str = ""
    engine_source: str = ""
    tables_note: str = ""  # how the kernel tables were chosen (or why bundled ones were not used)
    tables_auto: bool = False  # tables chosen by device and engine, not named by the run
    speculative: Speculative | None = None
    draft_model: ModelCard | None = None  # method draft: the draft model's card
    draft_deployment: Deployment | None = None  # method draft: how the draft model runs (see draft_deployment)
    draft_model_source: str = ""
    # engine-derived deployment fields the run named itself (the rest a variant derives afresh)
    named_deployment: frozenset[str] = frozenset()
    # what the command line's names resolved to and what of the config file was adapted to the
    # model it chose (infersim.run.flags): one line each, shown with the report
    notes: tuple[str, ...] = ()
    electricity: Electricity = Electricity()  # what energy costs (run config section `energy`)
    calibration: CalibrationProfile | None = None  # the profile set on hardware and engine (run config `calibration`)
    uncalibrated: tuple[HardwareCard, EngineCard] | None = None  # the two cards as they were before it


# ---------------------------------------------------------------------------------------------
# Loading


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise InferSimError(f"--set '{text}': expected dotted.field=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(path):
        raise InferSimError(f"--set '{text}': empty part in field name '{key}'")
    return path, parse_flag_value(raw, f"--set {key.strip()}=")


#: mapping entries looked at per --set value when listing the fields it sets: a YAML alias can nest
#: one mapping in another many times over, and 100,000 characters of it can stand for billions
_LEAF_BUDGET = 10_000
_SCALARS = (str, int, float, bool, type(None))


def _fields_set(path: tuple[str, ...], value: Any) -> list[tuple[tuple[str, ...], Any]]:
    """The (dotted field, value) pairs one --set writes: its field, or each leaf of the mapping it
    gives (`deployment.attention={tp: 2}` writes deployment.attention.tp). Past the budget, the
    field itself."""
    out: list[tuple[tuple[str, ...], Any]] = []
    stack: list[tuple[tuple[str, ...], Any]] = [(path, value)]
    seen = 0
    while stack:
        where, item = stack.pop()
        seen += 1
        if seen > _LEAF_BUDGET:
            return [(path, value)]
        if isinstance(item, dict) and item:
            stack.extend((where + (str(key),), child) for key, child in item.items())
        else:
            out.append((where, item))
    return out


def _same_value(first: tuple[Any, str], second: tuple[Any, str]) -> bool:
    """Whether two --set values of one field are the same: the same text, or equal scalars of one
    type (1 and 1.0, or 1 and true, are not the same). Containers are not compared: a YAML alias
    can make their comparison take for ever."""
    (a, a_text), (b, b_text) = first, second
    if a_text.strip() == b_text.strip():
        return True
    return isinstance(a, _SCALARS) and type(a) is type(b) and a == b


#: a --set of one of these names a card (`model=qwen3-8b`): the fields set on it before or after
#: (`model.num_hidden_layers=4`) apply to the card it names, whichever order they come in
_CARD_HEADS = frozenset({("model",), ("hardware",), ("engine",)})


def parse_overrides(texts: list[str] | tuple[str, ...]) -> list[tuple[list[str], Any, str]]:
    """Every `--set FIELD=VALUE` parsed: (dotted path, value, text). A field given twice with
    different values is refused naming both, and so is a section replaced by a later --set after
    an earlier one set a field in it: the last silently winning hides a typo or a stale flag. A
    card named and one of its fields (`model=qwen3-8b`, `model.num_hidden_layers=4`) are two fields."""
    parsed = []
    first: dict[tuple[str, ...], tuple[Any, str]] = {}
    for text in texts:
        path, value = parse_override(text)
        fields = _fields_set(tuple(path), value)
        _check_replaced(tuple(path), {field for field, _ in fields}, first, text)
        for field, item in fields:
            earlier = first.setdefault(field, (item, text))
            if not _same_value(earlier, (item, text)):
                raise InferSimError(
                    f"--set {shorten(text)}: field '{'.'.join(field)}' is also set by --set {shorten(earlier[1])} "
                    f"({echo(earlier[0])}, then {echo(item)}): which is meant is not guessed; give it once")
        parsed.append((path, value, text))
    return parsed


def _check_replaced(path: tuple[str, ...], fields: set[tuple[str, ...]],
                    earlier: dict[tuple[str, ...], tuple[Any, str]], text: str) -> None:
    """Refuse a --set that replaces a section in which an earlier --set set a field its value
    does not hold (that field would be dropped)."""
    if path in _CARD_HEADS:
        return
    for field, (_value, before) in earlier.items():
        if len(field) > len(path) and field[:len(path)] == path and field not in fields:
            raise InferSimError(
                f"--set {shorten(text)}: replaces section '{'.'.join(path)}', which drops field "
                f"'{'.'.join(field)}' that --set {shorten(before)} gave before it: give that field inside the "
                "section's value, or set the section's fields one by one")


def _set_dotted(data: dict[str, Any], path: list[str], value: Any, text: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise InferSimError(f"--set '{text}': '{part}' is a value, not a section")
        node = child
    node[path[-1]] = value


def _load_card(cls: type, validator: Any, ref: str | dict[str, Any], kind: str, base: Path | None,
               overrides: list[tuple[list[str], Any, str]]) -> tuple[Any, str]:
    """Resolve a card reference (name, path, HF config.json or inline mapping), apply overrides, validate."""
    if isinstance(ref, dict):
        data, source = copy.deepcopy(ref), "inline card"
    else:
        resolved = resolve_card(ref, kind, base)
        path = resolved.path
        source = str(path)
        if path.suffix == ".json":
            from infersim.cards.hf_import import card_from_hf_file  # here: a plain run names bundled YAML cards

            data = card_from_hf_file(path)
        else:
            data = load_yaml(path)
        if not isinstance(data, dict):
            raise ConfigError(source, "", MISSING, f"expected a mapping of {cls.__name__} fields")
        if resolved.quantization is not None:
            data = _with_named_format(data, resolved.quantization, ref)
    for dotted, value, text in overrides:
        _set_dotted(data, dotted, value, text)
    # a value set by --set is not in the file: a later message about the card says so too
    where = source + (" with --set overrides" if overrides else "")
    return validator(build(cls, data, where), where), where


def _with_named_format(data: dict[str, Any], stated: dict[str, Any], ref: str) -> dict[str, Any]:
    """A model card's data with the checkpoint format its name states (Qwen/Qwen3-8B-AWQ: int4
    weights), unless the card's own checkpoint already stores its weights so; an HF id becomes the
    card's checkpoint (what --emit-launch loads)."""
    own = data.get("quantization")
    if isinstance(own, dict) and own.get("weights") == stated["weights"]:
        return data
    out = {**data, "quantization": stated}
    if ref.count("/") == 1 and not Path(ref).exists():
        out["checkpoint"] = ref
    return out


def load_model_card(ref: str | dict[str, Any], base: Path | None = None,
                    overrides: list[tuple[list[str], Any, str]] = ()) -> tuple[ModelCard, str]:
    return _load_card(ModelCard, validate_model, ref, "models", base, overrides)


def load_hardware_card(ref: str | dict[str, Any], base: Path | None = None,
                       overrides: list[tuple[list[str], Any, str]] = ()) -> tuple[HardwareCard, str]:
    return _load_card(HardwareCard, validate_hardware, ref, "hardware", base, overrides)


def load_engine_card(ref: str | dict[str, Any], base: Path | None = None,
                     overrides: list[tuple[list[str], Any, str]] = ()) -> tuple[EngineCard, str]:
    return _load_card(EngineCard, validate_engine, ref, "engines", base, overrides)


def check_engine_platform(engine: EngineCard, engine_source: str, hardware: HardwareCard) -> None:
    """Refuse a run of an engine on a GPU vendor its card does not list (EngineCard.vendors)."""
    if hardware.vendor in engine.vendors:
        return
    from infersim.cards.registry import engines_for_vendor

    others = engines_for_vendor(hardware.vendor)
    raise ConfigError(engine_source, "vendors", list(engine.vendors),
                      f"engine {engine.name} {engine.version} does not run on {hardware.vendor} GPUs, and hardware card "
                      f"{hardware.name} is one; engine cards for {hardware.vendor} GPUs: "
                      f"{', '.join(others) if others else 'none bundled'}")


def _default_engine_for(engine: EngineCard, hardware: HardwareCard, engine_source: str, base: Path | None,
                        overrides: list[tuple[list[str], Any, str]]) -> tuple[EngineCard, str, str]:
    """The newest bundled card of the default engine that runs on the hardware's vendor, when the
    run names no engine and the default card does not run there (and the note saying so)."""
    from infersim.cards.registry import engines_for_vendor

    same = [s for s in engines_for_vendor(hardware.vendor) if s.split("@")[0] == engine.name]
    if not same:
        return engine, engine_source, ""  # check_engine_platform says which engines run there
    chosen = same[-1]
    card, source = load_engine_card(chosen, base, overrides)
    return card, source, (f"engine: no engine named, and the default {DEFAULT_ENGINE} does not run on "
                          f"{hardware.vendor} GPUs: {chosen} (the newest bundled {engine.name} card that does)")


_ENGINE_CACHE: dict[str, EngineCard] = {}


def default_engine(name: str = DEFAULT_ENGINE) -> EngineCard:
    """A bundled engine card by name (cached: cards are immutable)."""
    if name not in _ENGINE_CACHE:
        _ENGINE_CACHE[name] = load_engine_card(name)[0]
    return _ENGINE_CACHE[name]


def load_run_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                    mfu_tables: str | None = None, flags: RunFlags | None = None) -> RunConfig:
    """Read, override, resolve and validate a run config. Raises InferSimError subclasses only.
    `flags` (infersim.run.flags) are the direct flags of a command line: set on top of the file
    (path None: on top of nothing but the flags' own defaults), before `overrides`."""
    raw, source, base = read_run_mapping(path, flags)
    return config_from_mapping(raw, source, overrides, mfu_tables, base=base, flags=flags)


def read_run_mapping(path: str | Path | None, flags: RunFlags | None = None) -> tuple[dict[str, Any], str, Path | None]:
    """(run mapping as written, its source, the directory its relative paths start from) of a
    config file, or of the direct flags when there is no file."""
    if path is None:
        if flags is None or flags.model is None or flags.hardware is None:
            missing = " and ".join(f"--{name}" for name in ("model", "hardware")
                                   if flags is None or getattr(flags, name) is None)
            raise InferSimError(f"give --config FILE, or {missing} (e.g. --model llama-3.1-8b --hardware h100)")
        return base_mapping(flags), "command line", None
    config_path = resolve(str(path), "configs")
    raw = load_yaml(config_path)
    if not isinstance(raw, dict):
        raise ConfigError(str(config_path), "", MISSING, "expected a mapping with model, hardware, deployment, workload")
    return raw, str(config_path), config_path.parent


def _leaf_paths(data: Any, prefix: str = "") -> set[str]:
    """Every dotted path of a nested mapping, sections and leaves ("ffn", "ffn.ep")."""
    out: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}{key}"
            out.add(path)
            out |= _leaf_paths(value, path + ".")
    return out


def _card_notes(raw: dict[str, Any], base: Path | None) -> list[str]:
    """What each card name of the run resolved to where it was not exact (h100 -> h100-sxm)."""
    from infersim.cards.registry import resolve_name

    notes = []
    for key, kind in (("model", "models"), ("hardware", "hardware"), ("engine", "engines")):
        ref = raw.get(key)
        if isinstance(ref, str):
            note = resolve_name(ref, kind, base)[1]
            if note:
                notes.append(note)
    return notes


def _kernel_tables(table_dir: str | None, hardware_changed: bool, kernel_libraries: KernelLibraries,
                   hardware: HardwareCard, engine: EngineCard, base: Path | None,
                   where: str) -> tuple[KernelTables, EngineCard, str, str]:
    """The kernel tables a run prices with (named, bundled for its hardware and engine, or none), the
    engine card with the host times the tables measured, where the tables came from, and a note."""
    tables: KernelTables = NoTables()
    tables_source = tables_note = ""
    if table_dir in (None, "", "auto"):
        table_dir = None
        if hardware_changed:
            # measured times belong to the real device: a modified or inline card is timed by roofline
            tables_note = ("bundled kernel tables not used: the hardware card is inline or changed by --set, "
                           "and measured times belong to the unmodified device")
        else:
            from infersim.tables.select import bundled_tables_for

            choice = bundled_tables_for(hardware.name, engine.framework)
            if choice is not None:
                table_dir, tables_note = str(choice.path), choice.note
    elif table_dir == "none":
        table_dir = None
    if table_dir:
        from infersim.tables.lookup import load_tables  # measured tables are optional

        from infersim.cards.registry import bundled_dir, resolve_table_dir

        # none found: load_tables names the bundled path it tried
        table_path = resolve_table_dir(table_dir, base) or bundled_dir("mfu_tables") / table_dir
        tables = load_tables(table_path)
        tables_source = str(table_path)
        tables.check_hardware(hardware, where)  # no row may beat the card's HBM bandwidth
        tables, skipped_note = restrict_to_libraries(tables, kernel_libraries)
        tables_note = "; ".join(n for n in (tables_note, skipped_note) if n)
        provenance = getattr(tables, "provenance", None)
        if provenance is not None:
            from infersim.cards.engine import with_measured_host

            engine, host_note = with_measured_host(engine, provenance.launch_cpu, provenance.step_cpu,
                                                   provenance.host_probes)
            tables_note = "; ".join(n for n in (tables_note, host_note) if n)
    return tables, engine, tables_source, tables_note


def config_from_mapping(raw: dict[str, Any], source: str, overrides: list[str] | tuple[str, ...] = (),
                        mfu_tables: str | None = None, base: Path | None = None,
                        flags: RunFlags | None = None) -> RunConfig:
    raw = copy.deepcopy(raw)
    file_model = raw.get("model")
    command_line: set[str] = set()
    if flags is not None:
        for name, value in flag_fields(flags).items():
            _set_dotted(raw, name.split("."), value, f"--{name}")
            if name.startswith("deployment."):
                command_line.add(name[len("deployment."):])
    card_overrides: dict[str, list[tuple[list[str], Any, str]]] = {"model": [], "hardware": [], "engine": []}
    parsed = parse_overrides(overrides)
    for dotted, value, text in parsed:
        head = dotted[0]
        if head in card_overrides and len(dotted) > 1 and not isinstance(raw.get(head), dict):
            card_overrides[head].append((dotted[1:], value, text))
        else:
            _set_dotted(raw, dotted, value, text)
            if head == "deployment" and len(dotted) > 1:
                command_line.add(".".join(dotted[1:]))
                command_line |= _leaf_paths(value, ".".join(dotted[1:]) + ".")
    where = source + (" with --set overrides" if overrides else "")
    notes = _card_notes(raw, base)
    spec_ = build(RunSpec, raw, where)
    model, model_source = load_model_card(spec_.model, base, card_overrides["model"])
    hardware, hardware_source = load_hardware_card(spec_.hardware, base, card_overrides["hardware"])
    engine, engine_source = load_engine_card(spec_.engine, base, card_overrides["engine"])
    if "engine" not in raw and hardware.vendor not in engine.vendors:
        engine, engine_source, note = _default_engine_for(engine, hardware, engine_source, base,
                                                          card_overrides["engine"])
        notes += [note] if note else []
    check_engine_platform(engine, engine_source, hardware)
    if model.imported_as:
        notes.append(f"model {model.name}: simulated as the {model.imported_as} family at its config's request "
                     "(infersim_family): its own architecture is not one InferSim models")
    model_switched = raw.get("model") != file_model and source != "command line"
    dep_spec, layout_notes, unnamed = fit_layout(spec_.deployment, model, hardware,
                                        frozenset(_leaf_paths(raw.get("deployment"))), frozenset(command_line),
                                        flags, model_switched)
    notes += layout_notes
    spec_ = replace(spec_, deployment=dep_spec)
    dep_spec = spec_.deployment
    named = named_deployment_fields(raw.get("deployment")) - unnamed
    dep_spec = with_engine_defaults(dep_spec, named, model, engine)
    dep_spec = with_checkpoint_precision(dep_spec, named, model, hardware)
    deployment = complete_layout(dep_spec, model, hardware, where)
    refuse_layout_overrides(flags, parsed, deployment)
    notes += [note for note in (replicas_note(deployment, model),) if note]
    hardware_changed = bool(card_overrides["hardware"]) or not isinstance(spec_.hardware, str)
    tables, engine, tables_source, tables_note = _kernel_tables(
        mfu_tables if mfu_tables is not None else spec_.mfu_tables, hardware_changed, spec_.kernel_libraries,
        hardware, engine, base, where)
    profile, uncalibrated, hardware, engine = _calibrated(spec_.calibration, base, hardware, engine, notes)
    draft, draft_dep, draft_source = None, None, ""
    if spec_.speculative is not None:
        draft, draft_dep, draft_source = _speculative_drafter(spec_.speculative, model, hardware, deployment, base, where)
    return RunConfig(model=model, hardware=hardware, deployment=deployment, workload=spec_.workload, tables=tables,
                     engine=engine, engine_source=engine_source, tables_note=tables_note,
                     tables_auto=mfu_tables in (None, "auto") and spec_.mfu_tables in (None, "auto"),
                     source=source, model_source=model_source, hardware_source=hardware_source,
                     tables_source=tables_source, speculative=spec_.speculative, draft_model=draft,
                     draft_deployment=draft_dep, draft_model_source=draft_source,
                     named_deployment=named, notes=tuple(notes), electricity=spec_.energy,
                     calibration=profile, uncalibrated=uncalibrated)


def _calibrated(path: str | None, base: Path | None, hardware: HardwareCard, engine: EngineCard, notes: list[str],
                ) -> tuple[CalibrationProfile | None, tuple[HardwareCard, EngineCard] | None, HardwareCard, EngineCard]:
    """(profile, the cards before it, the cards with it) of a run config's `calibration` key."""
    if not path:
        return None, None, hardware, engine
    from infersim.cards.calibration import apply_profile, load_profile  # a run without a profile needs neither

    profile = load_profile(path, base)
    notes.append(profile.describe())
    return (profile, (hardware, engine), *apply_profile(profile, hardware, engine))


def without_calibration(config: RunConfig) -> RunConfig:
    """The same run on the cards as they were before its calibration profile (itself when it has none)."""
    if config.uncalibrated is None:
        return config
    hardware, engine = config.uncalibrated
    return replace(config, hardware=hardware, engine=engine, calibration=None, uncalibrated=None)


def with_variant(config: RunConfig, model: ModelCard, hardware: HardwareCard, deployment: Deployment,
                 workload: Workload) -> RunConfig:
    """The same run with another (validated) model, hardware, layout or workload; the speculative
    drafter is checked and placed again for it (the draft card is not reloaded)."""
    if hardware is not config.hardware:
        check_engine_platform(config.engine, f"engine card {config.engine.name} {config.engine.version}", hardware)
        hardware = _calibrated_variant(config, hardware)
    draft, draft_dep, draft_source = None, None, ""
    if config.speculative is not None:
        loaded = (config.draft_model, config.draft_model_source) if config.draft_model is not None else None
        draft, draft_dep, draft_source = _speculative_drafter(config.speculative, model, hardware, deployment,
                                                              None, config.source, loaded)
    return evolve(config, model=model, hardware=hardware, deployment=deployment, workload=workload,
                  draft_model=draft, draft_deployment=draft_dep, draft_model_source=draft_source)


def _calibrated_variant(config: RunConfig, hardware: HardwareCard) -> HardwareCard:
    """A variant's GPU with the run's calibration set when the profile is for that GPU (the profile's
    engine constants are on config.engine already)."""
    profile = config.calibration
    if profile is None or config.uncalibrated is None or hardware.name != profile.hardware:
        return hardware
    if hardware == config.hardware:
        return hardware  # the run's own (calibrated) card
    from infersim.cards.calibration import apply_profile  # a run with a profile has imported it already

    return apply_profile(profile, hardware, config.engine)[0]


def _speculative_drafter(spec_: Speculative, model: ModelCard, hardware: HardwareCard, dep: Deployment,
                         base: Path | None, where: str, loaded: tuple[ModelCard, str] | None = None,
                         ) -> tuple[ModelCard | None, Deployment | None, str]:
    """Check the speculative section against the model; load (unless `loaded`) and place the draft model."""
    if dep.pp > 1:
        raise ConfigError(where, "speculative", spec_.method, "speculative decoding with pipeline parallelism "
                          "(deployment.pp > 1) is not modelled")
    if dep.weight_offload != "none":
        # the drafter's and the verification step's plans are priced without the weight stream
        raise ConfigError(where, "deployment.weight_offload", dep.weight_offload,
                          "weight offload with speculative decoding is not modelled")
    if spec_.method == "mtp":
        if spec_.draft_model is not None:
            raise ConfigError(where, "speculative.draft_model", spec_.draft_model, "only for method draft (mtp uses "
                              "the model's own MTP layers)")
        if model.num_nextn_predict_layers <= 0:
            raise ConfigError(where, "speculative.method", "mtp", f"model {model.name} has no MTP layers "
                              "(num_nextn_predict_layers is 0)")
        return None, None, ""
    if spec_.draft_model is None:
        raise ConfigError(where, "speculative.draft_model", MISSING, "method draft needs a draft model card")
    draft, source = loaded or load_model_card(spec_.draft_model, base)
    if draft.vocab_size != model.vocab_size:
        raise ConfigError(where, "speculative.draft_model", draft.name,
                          f"vocabulary of {draft.vocab_size} tokens differs from the model's {model.vocab_size}: "
                          "draft and model must share a tokenizer")
    try:
        draft_dep = complete_layout(draft_deployment(dep), draft, hardware, where)
    except ConfigError as exc:
        raise ConfigError(where, "speculative.draft_model", draft.name,
                          f"cannot run tensor-parallel over the {dep.attention.tp} GPUs of an attention group: "
                          f"{exc.problem}") from None
    return draft, draft_dep, source

def weights_origin(config: RunConfig) -> dict[str, Any]:
    """Which format the weights have and where it came from (the checkpoint, the run config, or
    the default), for the report."""
    dep, model, named = config.deployment, config.model, config.named_deployment
    q = model.quantization
    prec = dep.precision

    def origin(field: str, value: str, stored: str | None) -> str:
        if f"precision.{field}" in named or (field == "expert_weights" and "precision.weights" in named):
            return "run config" + (f"; the checkpoint stores {stored}" if stored and stored != value else "")
        if q is None:
            return "default: an unquantised checkpoint, stored as the GEMM inputs"
        return "checkpoint" if stored == value else f"quantised online to the GEMM inputs; the checkpoint stores {stored}"

    out: dict[str, Any] = {
        "gemm": prec.gemm, "gemm_from": "run config" if "precision.gemm" in named else (
            "checkpoint" if q is not None and q.activations == prec.gemm else "default"),
        "weights": prec.weight_dtype, "weights_from": origin("weights", prec.weight_dtype, q.weights if q else None),
        "checkpoint": {"method": q.method, "weights": q.weights, "expert_weights": q.expert_weights,
                       "attention_weights": q.attention_weights,
                       "activations": q.activations, "group_size": q.group_size, "detail": q.describe()} if q else None,
    }
    if model.is_moe:
        out["expert_weights"] = prec.expert_weight_dtype
        out["expert_weights_from"] = origin("expert_weights", prec.expert_weight_dtype,
                                            q.expert_weights if q else None)
    if prec.attention_weight_dtype != prec.weight_dtype:
        out["attention_weights"] = prec.attention_weight_dtype
        out["attention_weights_from"] = origin("attention_weights", prec.attention_weight_dtype,
                                               q.attention_weights if q else None)
    return out

