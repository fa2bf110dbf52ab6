"""Finding the per-rank trace files of one profile run.

SGLang writes one file per rank: `<profile_id>-TP-<r>[-DP-<d>][-PP-<p>][-EP-<e>][-<stage>].trace.json.gz`
with an optional stage suffix (`-EXTEND` / `-DECODE` in older versions, `-prefill` / `-decode`
with profile v2); a merged file holds several ranks. `--trace` accepts a file, a directory of
such files or a glob. Rank 0 (TP-0 of pipeline stage 0) is analysed by default; `--rank R` picks TP
rank R and `--rank all` analyses every rank.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path

from infersim.base.errors import InferSimError

_RANK_NAME = re.compile(
    r"-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?"
    r"(?:-(?P<stage>EXTEND|DECODE|PREFILL|prefill|decode|extend))?\.(?:pt\.)?trace\.json(?:\.gz)?$")
_TRACE_SUFFIXES = (".json", ".json.gz")
_STAGE_OF_SUFFIX = {"extend": "prefill", "prefill": "prefill", "decode": "decode"}


@dataclass(frozen=True)
class RankFile:
    path: Path
    tp: int | None  # None when the name carries no rank
    dp: int | None = None
    pp: int | None = None
    ep: int | None = None
    stage: str | None = None  # "prefill" / "decode" from the file name, else None

    @property
    def rank_label(self) -> str:
        if self.tp is None:
            return ""
        parts = [f"TP-{self.tp}"]
        parts += [f"{k}-{v}" for k, v in (("DP", self.dp), ("PP", self.pp), ("EP", self.ep)) if v is not None]
        return "-".join(parts)

    @property
    def sort_key(self) -> tuple[int, int, int, str]:
        return (self.pp or 0, self.tp if self.tp is not None else -1, self.dp or 0, self.path.name)


def parse_rank_file(path: Path) -> RankFile:
    match = _RANK_NAME.search(path.name)
    if not match:
        return RankFile(path, None)

    def num(key: str) -> int | None:
        value = match.group(key)
        return int(value) if value is not None else None

    stage = match.group("stage")
    return RankFile(path, num("tp"), num("dp"), num("pp"), num("ep"),
                    _STAGE_OF_SUFFIX[stage.lower()] if stage else None)


def _is_trace_name(path: Path) -> bool:
    return path.is_file() and path.name.endswith(_TRACE_SUFFIXES)


def find_trace_files(spec: str) -> list[RankFile]:
    """The trace files named by a path, a directory or a glob, sorted by rank."""
    path = Path(spec)
    if spec == "-" or (path.exists() and not path.is_dir() and not path.is_file()):
        return [RankFile(path, None)]  # standard input, a pipe or a device: read once, forward only
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if _is_trace_name(p))
        if not files:
            raise InferSimError(f"{spec}: directory holds no trace files (*.json or *.json.gz)")
    elif path.exists():
        files = [path]
    elif any(ch in spec for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(spec) if Path(p).is_file())
        if not files:
            raise InferSimError(f"{spec}: no file matches this pattern")
    else:
        raise InferSimError(f"{spec}: no such file or directory")
    return sorted((parse_rank_file(p) for p in files), key=lambda f: f.sort_key)


def select_rank_files(files: list[RankFile], rank: str | None) -> list[RankFile]:
    """Files to analyse: rank None = the lowest rank; an integer = that TP rank; 'all' = every file.

    A rank with a separate file per stage (`-EXTEND`, `-DECODE`) keeps all its stage files.
    """
    if rank == "all":
        return files
    named = [f for f in files if f.tp is not None]
    if rank is None:
        if not named:
            return files[:1]  # names without ranks: the first file, in name order
        low = min(named, key=lambda f: f.sort_key)
        return [f for f in named if (f.tp, f.pp or 0, f.dp or 0) == (low.tp, low.pp or 0, low.dp or 0)]
    try:
        wanted = int(rank)
    except ValueError:
        raise InferSimError(f"--rank {rank!r}: expected a TP rank number or 'all'") from None
    chosen = [f for f in named if f.tp == wanted]
    if chosen:
        low_pp = min(f.pp or 0 for f in chosen)
        return [f for f in chosen if (f.pp or 0) == low_pp]
    if not named and len(files) == 1:
        return files  # one (possibly merged) file: the rank is picked among its GPUs
    ranks = ", ".join(sorted({str(f.tp) for f in named})) or "none in the file names"
    raise InferSimError(f"--rank {wanted}: no trace file for TP rank {wanted} (ranks found: {ranks})")
