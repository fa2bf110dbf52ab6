"""`infersim cache info` and `infersim cache clear`: the on-disk cache (infersim.base.diskcache)."""

from __future__ import annotations

import argparse

from infersim.base import diskcache
from infersim.base.errors import InferSimError

#: how `cache info` names each kind of file, in its order
KIND_NAMES = {"yaml": "parsed YAML files", "tables": "indexed kernel tables", "earlier version":
              "entries of earlier versions", "unfinished write": "unfinished writes"}


def register(subparsers: argparse._SubParsersAction) -> None:
    cache = subparsers.add_parser("cache", help="the on-disk cache: where it is and how big; clear it")
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="where the cache is, whether it is used, its size and cap, its entries by kind")
    info.set_defaults(handler=_info)
    clear = sub.add_parser("clear", help="delete InferSim's entries from the cache directory (no other file)")
    clear.set_defaults(handler=_clear)


def _mb(size: float) -> str:
    return f"{size / 1e6:.2f} MB"


def info_lines(state: diskcache.CacheState) -> list[str]:
    """What `cache info` prints."""
    if state.directory is None:
        return ["the on-disk cache is off (INFERSIM_CACHE=off)"]
    lines = [f"cache directory: {state.directory}"]
    if state.problem == "it does not exist":
        lines.append("  not created yet: the next run creates it (mode 0700)")
    elif state.problem:
        lines.append(f"  not used: {state.problem} (InferSim uses only a directory of its own user that "
                     f"nobody else can write to)")
    total = sum(f.size for f in state.files)
    lines.append(f"size: {_mb(total)} of InferSim's files, cap {_mb(state.cap)} (INFERSIM_CACHE_MAX_MB)")
    for kind, name in KIND_NAMES.items():
        files = [f for f in state.files if f.kind == kind]
        if files or kind in ("yaml", "tables"):
            lines.append(f"  {name:<28} {len(files):>5}  {_mb(sum(f.size for f in files)):>10}")
    lines.append("clear it: infersim cache clear; turn it off: INFERSIM_CACHE=off; move it: INFERSIM_CACHE_DIR")
    return lines


def _info(args: argparse.Namespace) -> int:
    print("\n".join(info_lines(diskcache.cache_state())))
    return 0


def _refused(directory: str, why: str) -> None:
    raise InferSimError(f"not clearing the cache directory {directory}: {why} (InferSim uses only a directory of "
                        f"its own user that nobody else can write to)")


def _clear(args: argparse.Namespace) -> int:
    directory = diskcache.cache_dir()
    if directory is None:
        print("the on-disk cache is off (INFERSIM_CACHE=off): nothing cleared")
        return 0
    removed = diskcache.clear(_refused)
    print(f"deleted {len(removed)} of InferSim's files ({_mb(sum(f.size for f in removed))}) from {directory}; "
          f"no other file is touched")
    return 0
