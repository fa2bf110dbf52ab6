"""Where bundled cards, tables and example configs live, and how names resolve to files.

A name resolves in this order: an existing path (relative to the working directory or absolute);
a card of that name in ./models, ./hardware or ./engines of the working directory (where `infersim
cards import-hf` writes); then the bundled directory of that kind, with or without the `.yaml`
ending; then forgivingly (`match_bundled`, infersim.cards.names: case, punctuation, aliases, HF ids, unique prefixes). Bundled data sits at
the repository root in a checkout and under `infersim/_bundled/` in an installed wheel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersim.base.errors import InferSimError
from infersim.cards.names import (NameMatch, Spelling, card_spellings, fold, match_name, near_miss, repo_part,
                                   suggestions)

__all__ = ["fold"]  # re-exported: callers compare names as the matching does

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


# Card kinds whose bundled cards may list `aliases` (other names they answer to).
_ALIAS_KINDS = ("models", "hardware", "engines")
_SPELLINGS: dict[str, list[Spelling]] = {}


def bundled_spellings(kind: str) -> list[Spelling]:
    """The other names the bundled cards of `kind` answer to (aliases; a model's checkpoint ids),
    read only when a name misses: an exact name never loads the other cards."""
    if kind not in _SPELLINGS:
        from infersim.cards.schema import load_yaml  # here: exact names need no YAML

        found: list[Spelling] = []
        directory = bundled_dir(kind)
        for name in bundled_names(kind):
            try:
                data = load_yaml(directory / f"{name}.yaml")
            except InferSimError:
                continue  # a broken card says so when it is loaded by its own name
            found += card_spellings(name, data, kind)
        _SPELLINGS[kind] = found
    return _SPELLINGS[kind]


def _singular(kind: str) -> str:
    return kind[:-1] if kind.endswith("s") else kind


def match_bundled(name: str, kind: str) -> NameMatch | None:
    """The bundled card a name that is no file and no bundled name as written means (the rules of
    infersim.cards.names: case and punctuation, aliases and checkpoint ids, a model's release and
    format words, a unique prefix in whole words); None when nothing matches; an error when the
    name is ambiguous or states a weight format that cannot be priced."""
    if kind not in _ALIAS_KINDS:
        return None
    return match_name(name, kind, bundled_names(kind), bundled_spellings(kind))


def forgiving_name(name: str, kind: str) -> tuple[str, str] | None:
    """(bundled card name, how it was matched) for a name that is no file and no bundled name as
    written (see match_bundled); None when nothing matches."""
    found = match_bundled(name, kind)
    return (found.card, found.how) if found is not None else None


@dataclass(frozen=True)
class Resolved:
    """What a card name or path resolved to."""

    path: Path
    note: str = ""  # how a forgiving match read the name (empty for a path or an exact bundled name)
    quantization: dict[str, Any] | None = None  # a model checkpoint's format the name states


def not_found(name_or_path: str, kind: str) -> InferSimError:
    """The message for a name nothing matches: the closest bundled names, and what else to do."""
    import difflib  # only for a name that does not resolve

    names = bundled_names(kind)
    # an engine is asked for by its name (vllm), its cards are named by version (vllm-0.15)
    candidates = sorted({e.name for e in bundled_engines()}) + names if kind == "engines" else names
    close = suggestions(name_or_path, candidates, bundled_spellings(kind)) if kind in _ALIAS_KINDS else \
        difflib.get_close_matches(name_or_path, candidates, n=3)
    miss = near_miss(name_or_path, names, bundled_spellings(kind)) if kind == "models" else ""
    hint = f": {miss}" if miss else f"; did you mean {' or '.join(close)}?" if close else ""
    known = ", ".join(names) or "none"
    model_hint = (" A model not bundled: pass the path of its HF config.json, or `infersim cards import-hf` it."
                  if kind == "models" else "")
    return InferSimError(f"{_singular(kind)} '{name_or_path}' not found{hint} (no such file, and no bundled {kind} "
                         f"entry of that name; bundled: {known}).{model_hint}")


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
            aliases = data.get("aliases")
            aliases = aliases if isinstance(aliases, list) else []
            vendors = data.get("vendors")
            vendors = vendors if isinstance(vendors, list) else ["nvidia"]
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


def resolve_card(name_or_path: str, kind: str, relative_to: Path | None = None) -> Resolved:
    """The file a bundled name, a forgiving spelling of one, or a path names; raises when nothing
    matches, suggesting the closest names."""
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
            return Resolved(candidate)
    for candidate in candidates[:given]:  # a path the user gave that names a directory
        if candidate.is_dir():
            raise InferSimError(f"{name_or_path}: is a directory, not a {_singular(kind)} file")
        if candidate.exists():  # a device, a pipe or a socket: reading it could block or never end
            raise InferSimError(f"{name_or_path}: is not a regular file (a device, pipe or socket); give the path "
                                 f"of a {_singular(kind)} file")
    if kind == "engines" and "/" not in name_or_path:
        chosen = select_engine(name_or_path)
        if chosen is not None:
            return Resolved(bundled / f"{chosen[0]}.yaml", chosen[1])
    found = match_bundled(name_or_path, kind)
    if found is None:
        raise not_found(name_or_path, kind)
    note = f"{_singular(kind)} '{name_or_path}' -> {found.card} ({found.how})"
    if found.format_note:
        note += f"; {found.format_note}"
    return Resolved(bundled / f"{found.card}.yaml", note, found.quantization)


def served_model_name(model_id: str) -> tuple[str, str]:
    """(model name to resolve, note) for the model a server was started with, as a benchmark file
    records it: a local directory holding a config.json is read from that file; any other path
    (`vllm serve /models/Llama-3.3-70B-Instruct`) names its model by its last part."""
    path = Path(model_id).expanduser()
    if (path / "config.json").is_file():
        return str(path / "config.json"), f"model: the file's model_id {model_id}: its config.json"
    looks_like_path = model_id.startswith(("/", "./", "../", "~")) or model_id.count("/") > 1
    if looks_like_path and repo_part(model_id):
        return repo_part(model_id), (f"model: the file's model_id {model_id} is a path on the server; its last part "
                                     f"{repo_part(model_id)} names the model")
    return model_id, f"model: the file's model_id {model_id}"


def resolve_name(name_or_path: str, kind: str, relative_to: Path | None = None) -> tuple[Path, str]:
    """(existing file, note) for a bundled name or a path; the note says what a forgiving match
    resolved the name to (empty for a path or an exact bundled name). Raises when nothing matches."""
    resolved = resolve_card(name_or_path, kind, relative_to)
    return resolved.path, resolved.note


def resolve(name_or_path: str, kind: str, relative_to: Path | None = None) -> Path:
    """Turn a bundled name (or a forgiving spelling of one, see forgiving_name) or a path into an
    existing file path, or explain what was tried."""
    return resolve_name(name_or_path, kind, relative_to)[0]


def other_bundled_model(model_id: str, card: Any) -> NameMatch | None:
    """The bundled model card a benchmark result's model_id names where it is not `card`'s model
    (None: the same model, or one that cannot be told apart). The id is the same model where it (or
    its last part) is the card's name or one of its checkpoints' HF ids, and another where it reads as
    another bundled card than `card`, a bundled one. An id no bundled card answers to (a fine-tune, a
    local checkpoint), or a card of the user's own, cannot be told apart."""
    ids = [i for i in (card.checkpoint, *card.quantized_checkpoints.values()) if i]
    names = {fold(card.name), *(fold(i) for i in ids), *(fold(repo_part(i)) for i in ids)}
    if not model_id or {fold(model_id), fold(repo_part(model_id))} & names:
        return None
    try:
        found = match_bundled(served_model_name(model_id)[0], "models")
    except InferSimError:  # an id several cards answer to, or a format not priced: no one card it names
        return None
    if found is None or found.card == card.name or card.name not in bundled_names("models"):
        return None
    return found
