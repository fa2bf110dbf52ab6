"""Where bundled cards, tables and example configs live, and how names resolve to files.

A name resolves in this order: an existing path (relative to the working directory or absolute);
a card of that name in ./models, ./hardware or ./engines of the working directory (where `infersim
cards import-hf` writes); then the bundled directory of that kind, with or without the `.yaml`
ending; then forgivingly (`forgiving_name`: case, punctuation, aliases, HF repository ids). Bundled data sits at
the repository root in a checkout and under `infersim/_bundled/` in an installed wheel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infersim.base.errors import InferSimError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
KINDS = ("models", "hardware", "engines", "mfu_tables", "configs")


def bundled_dir(kind: str) -> Path:
    """The bundled directory for `kind` (one of KINDS), installed or in a checkout."""
    installed = _PACKAGE_DIR / "_bundled" / kind
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / kind


def display_path(path: Path | str) -> str:
    """A path as a report shows it: a bundled file as `<kind>/...` marked bundled (the same on every
    machine, whether installed or in a checkout), anything else as it was given."""
    path = Path(path)
    try:
        resolved = path.resolve()  # once, not once per kind: each resolve stats every component
    except OSError:
        return str(path)
    for kind in KINDS:
        try:
            inside = resolved.relative_to(bundled_dir(kind).resolve())
        except (ValueError, OSError):
            continue
        return f"{kind}/{inside.as_posix()} (bundled)"
    return str(path)


def bundled_names(kind: str) -> list[str]:
    directory = bundled_dir(kind)
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.yaml"))


def resolve_table_dir(name_or_path: str, relative_to: Path | None = None) -> Path | None:
    """A kernel-table directory: the path as given, else relative to `relative_to` (a config's own
    directory), else the bundled set of that name under mfu_tables/; None when none exists."""
    given = Path(name_or_path).expanduser()
    candidates = [given]
    if relative_to is not None and not given.is_absolute():
        candidates.append(relative_to / given)
    candidates.append(bundled_dir("mfu_tables") / name_or_path)
    return next((c for c in candidates if c.exists()), None)


def fold(name: str) -> str:
    """A name as forgiving matching compares it: lower case, letters, digits and dots only
    ("TensorRT-LLM" and "tensorrt_llm" fold alike; "llama-3.1-8b" keeps its dots)."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


# Card kinds whose bundled cards may list `aliases` (other names they answer to).
_ALIAS_KINDS = ("models", "hardware", "engines")
_ALIASES: dict[str, dict[str, str]] = {}


def bundled_aliases(kind: str) -> dict[str, str]:
    """Folded alias -> bundled card name, from the `aliases` lists of the bundled cards of `kind`
    (read only when a name misses: an exact name never loads the other cards)."""
    if kind not in _ALIASES:
        from infersim.cards.schema import load_yaml  # here: exact names need no YAML

        table: dict[str, str] = {}
        directory = bundled_dir(kind)
        for name in bundled_names(kind):
            try:
                data = load_yaml(directory / f"{name}.yaml")
            except InferSimError:
                continue  # a broken card says so when it is loaded by its own name
            aliases = data.get("aliases") if isinstance(data, dict) else None
            for alias in aliases if isinstance(aliases, list) else ():
                table.setdefault(fold(str(alias)), name)
        _ALIASES[kind] = table
    return _ALIASES[kind]


def _singular(kind: str) -> str:
    return kind[:-1] if kind.endswith("s") else kind


def _model_candidates(name: str, names: list[str]) -> list[str]:
    """Bundled model cards an HF-style id may mean: the repository part of `org/Repo`, less a
    `Meta-` prefix, is a card's name, or starts with it followed by a variant suffix
    (`Llama-3.1-70B-Instruct` -> llama-3.1-70b, `Qwen3-30B-A3B-Instruct-2507` -> qwen3-30b-a3b:
    fine-tuned and instruct variants share the base model's config), longest match first."""
    repo = name.rsplit("/", 1)[-1].lower()
    tries = [repo] + ([repo[len("meta-"):]] if repo.startswith("meta-") else [])
    for attempt in tries:
        exact = [n for n in names if fold(n) == fold(attempt)]
        if exact:
            return exact
    for attempt in tries:
        prefixed = sorted((n for n in names if attempt.startswith(n.lower() + "-")), key=len, reverse=True)
        if prefixed:
            return prefixed[:1]
    return []


def forgiving_name(name: str, kind: str) -> tuple[str, str] | None:
    """(bundled card name, how it was matched) for a name that is no file and no bundled name as
    written: the same name ignoring case and punctuation (vLLM -> vllm), a card's alias (h100 ->
    h100-sxm, TensorRT-LLM -> trtllm), or for models an HF repository id (Qwen/Qwen3-8B -> qwen3-8b).
    None when nothing matches; an ambiguous name is an error listing the candidates."""
    names = bundled_names(kind)
    folded = fold(name)
    matches = [n for n in names if fold(n) == folded]
    how = "same name ignoring case and punctuation"
    if not matches and kind in _ALIAS_KINDS:
        aliases = bundled_aliases(kind)
        hit = aliases.get(folded) or (aliases.get(fold(name.rsplit("/", 1)[-1])) if kind == "models" else None)
        if hit:
            matches, how = [hit], f"an alias of bundled card {hit}"
    if not matches and kind == "models" and name.strip():
        matches = _model_candidates(name, names)
        how = "the bundled card made from that model's HF config"
    if not matches and kind == "hardware" and folded:
        stem = "-".join(name.lower().replace("_", " ").split())
        matches = [n for n in names if n.lower().startswith(stem + "-")]
        how = "the bundled card of that GPU"
    if len(matches) > 1:
        raise InferSimError(f"{_singular(kind)} '{name}' is ambiguous: it may mean {', '.join(matches)}; "
                            "give one of these names")
    return (matches[0], how) if matches else None


@dataclass(frozen=True)
class EngineEntry:
    """A bundled engine card as version selection sees it."""

    stem: str  # the file name without .yaml
    name: str
    aliases: tuple[str, ...]
    version: str
    vendors: tuple[str, ...]

    @property
    def selector(self) -> str:
        return f"{self.name}@{self.version}"


_ENGINES: list[list[EngineEntry]] = []  # one list, read once per process (the bundled cards do not change)


def bundled_engines() -> list[EngineEntry]:
    """Every bundled engine card's name, aliases, version and vendors (read only when a name is no
    file: an exact file name never loads the other cards)."""
    if not _ENGINES:
        from infersim.cards.schema import load_yaml  # here: exact names need no YAML

        entries = []
        directory = bundled_dir("engines")
        for stem in bundled_names("engines"):
            try:
                data = load_yaml(directory / f"{stem}.yaml")
            except InferSimError:
                continue  # a broken card says so when it is loaded by its own name
            if not isinstance(data, dict):
                continue
            aliases = data.get("aliases") if isinstance(data.get("aliases"), list) else []
            vendors = data.get("vendors") if isinstance(data.get("vendors"), list) else ["nvidia"]
            entries.append(EngineEntry(stem, str(data.get("name", stem)), tuple(str(a) for a in aliases),
                                       str(data.get("version", "")), tuple(str(v) for v in vendors)))
        _ENGINES.append(entries)
    return _ENGINES[0]


def version_key(version: str) -> tuple[int, ...]:
    """A dotted version as numbers for ordering ("0.15.1" -> (0, 15, 1); non-digits end a part)."""
    key = []
    for part in version.split("."):
        digits = len(part) - len(part.lstrip("0123456789"))
        key.append(int(part[:digits]) if digits else 0)
    return tuple(key)


def _version_parts(version: str) -> list[str]:
    """A requested version's dotted parts, less a leading v and a trailing wildcard (0.5.x -> 0, 5)."""
    parts = version.strip().lower().removeprefix("v").split(".")
    while parts and parts[-1] in ("x", "*", ""):
        parts.pop()
    return parts


def engine_family(name: str) -> list[EngineEntry]:
    """The bundled engine cards a name (or alias) stands for, oldest version first."""
    folded = fold(name)
    found = [e for e in bundled_engines() if fold(e.name) == folded or folded in (fold(a) for a in e.aliases)]
    return sorted(found, key=lambda e: version_key(e.version))


def engines_for_vendor(vendor: str) -> list[str]:
    """name@version of the bundled engine cards that run on this GPU vendor."""
    return [e.selector for e in sorted(bundled_engines(), key=lambda e: (e.name, version_key(e.version)))
            if vendor in e.vendors]


def select_engine(name: str) -> tuple[str, str] | None:
    """(bundled engine card stem, note) for `NAME` (the newest bundled card of that engine) or
    `NAME@VERSION` (the card of exactly that version, else the newest whose version starts with it:
    vllm@0.15 -> 0.15.1, sglang@0.5.x -> the newest 0.5); None when NAME is no bundled engine.
    An unknown version is an error listing the bundled ones."""
    family_name, at, wanted = name.partition("@")
    family = engine_family(family_name)
    if not family:
        return None
    exact_name = family_name == family[-1].name
    if not at:
        newest = family[-1]
        return newest.stem, ("" if exact_name else
                             f"engine '{name}' -> {newest.stem} (the newest bundled {newest.name} card, "
                             f"{newest.name} {newest.version})")
    exact = [e for e in family if e.version == wanted.strip()]
    parts = _version_parts(wanted)
    starting = [e for e in family if parts and e.version.lower().split(".")[: len(parts)] == parts]
    chosen = exact[-1] if exact else (starting[-1] if starting else None)
    if chosen is None:
        known = ", ".join(f"{e.version} ({e.selector})" for e in family)
        raise InferSimError(f"engine '{name}': no bundled {family[-1].name} card of version '{wanted}'; bundled "
                            f"{family[-1].name} versions: {known}; '{family[-1].name}' alone means the newest")
    note = "" if chosen.version == wanted.strip() and exact_name else (
        f"engine '{name}' -> {chosen.stem} ({chosen.name} {chosen.version})")
    return chosen.stem, note


def resolve_name(name_or_path: str, kind: str, relative_to: Path | None = None) -> tuple[Path, str]:
    """(existing file, note) for a bundled name or a path; the note says what a forgiving match
    resolved the name to (empty for a path or an exact bundled name). Raises when nothing matches."""
    candidates = [Path(name_or_path).expanduser()]
    if relative_to is not None and not Path(name_or_path).is_absolute():
        candidates.append(relative_to / name_or_path)
    given = len(candidates)
    if kind in _ALIAS_KINDS and "/" not in name_or_path and not Path(name_or_path).is_absolute():
        # a card `infersim cards import-hf` wrote to ./<kind>/ (its default --out) is found by its name
        local = Path.cwd() / kind
        candidates += [local / name_or_path, local / f"{name_or_path}.yaml"]
    bundled = bundled_dir(kind)
    candidates += [bundled / name_or_path, bundled / f"{name_or_path}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate, ""
    for candidate in candidates[:given]:  # a path the user gave that names a directory
        if candidate.is_dir():
            raise InferSimError(f"{name_or_path}: is a directory, not a {_singular(kind)} file")
    if kind == "engines" and "/" not in name_or_path:
        chosen = select_engine(name_or_path)
        if chosen is not None:
            return bundled / f"{chosen[0]}.yaml", chosen[1]
    found = forgiving_name(name_or_path, kind) if kind != "configs" else None
    if found is not None:
        card, how = found
        return bundled / f"{card}.yaml", f"{_singular(kind)} '{name_or_path}' -> {card} ({how})"
    known = ", ".join(bundled_names(kind)) or "none"
    hint = (" (a model not bundled: pass the path of its HF config.json, or `infersim cards import-hf` it)"
            if kind == "models" else "")
    raise InferSimError(
        f"{_singular(kind)} '{name_or_path}' not found: no such file, and no bundled "
        f"{kind} entry of that name (bundled: {known}){hint}"
    )


def resolve(name_or_path: str, kind: str, relative_to: Path | None = None) -> Path:
    """Turn a bundled name (or a forgiving spelling of one, see forgiving_name) or a path into an
    existing file path, or explain what was tried."""
    return resolve_name(name_or_path, kind, relative_to)[0]
