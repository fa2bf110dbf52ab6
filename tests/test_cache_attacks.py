"""The on-disk cache under attack: planted pickles and code objects, planted links, a user's files in
the cache directory, flipped bytes, a directory others can write to. Each run, a process of its own
(a crash would show as its exit status), prints what a run with the cache off prints, runs nothing
from the cache, and touches no file outside the cache directory."""

from __future__ import annotations

import marshal
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from infersim.base import diskcache

COMMAND = ["-m", "infersim", "--config", "qwen3-30b.yaml"]
WARNING = "infersim: warning: not using the cache directory"


def run(tmp_path: Path, cache: Path | None, *args: str, prefix: tuple[str, ...] = (),
        **env: str) -> subprocess.CompletedProcess[str]:
    """`python [prefix] args` in a home and working directory of the test's own."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1",
                   "INFERSIM_CACHE": "on", **env}
    if cache is None:
        environment["INFERSIM_CACHE"] = "off"
    else:
        environment["INFERSIM_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, *prefix, *(args or COMMAND)], capture_output=True, text=True, cwd=home,
                          env=environment, timeout=300, check=False)


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> str:
    """What the main command prints with the cache off."""
    done = run(tmp_path_factory.mktemp("off"), None)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


#: entries of each kind one run leaves (counted by the `warm` fixture)
WARM_ENTRIES: dict[str, int] = {}


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory, expected: str) -> Path:
    """A cache directory filled by one run."""
    where = tmp_path_factory.mktemp("warm")
    cache = where / "cache"
    done = run(where, cache)
    assert done.returncode == 0 and done.stdout == expected and done.stderr == ""
    kinds = sorted(diskcache.kind_of(p.name) for p in cache.iterdir())
    # the H20's tables; the config, its three cards and the engine cards read to pick the engine's version
    assert set(kinds) == {"tables", "yaml"} and kinds.count("tables") == 1 and kinds.count("yaml") >= 4
    WARM_ENTRIES["yaml"] = kinds.count("yaml")
    return cache


@pytest.fixture
def cache(tmp_path: Path, warm: Path) -> Path:
    """A copy of the warm cache, with a user's file beside it (outside the cache directory)."""
    copy = tmp_path / "cache"
    shutil.copytree(warm, copy)
    (tmp_path / "user").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "user" / "thesis.txt").write_text("a user's file\n")
    return copy


def snapshot(tmp_path: Path, cache: Path) -> dict[str, tuple[bool, bytes]]:
    """Every path under tmp_path outside the cache directory: (is a link, content or link target)."""
    found = {}
    for path in sorted(tmp_path.rglob("*")):
        if path == cache or cache in path.parents:
            continue
        if path.is_symlink():
            found[str(path)] = (True, os.readlink(path).encode())
        elif path.is_file():
            found[str(path)] = (False, path.read_bytes())
        else:
            found[str(path)] = (False, b"<directory>")
    return found


def entries(cache: Path, kind: str | None = None) -> list[Path]:
    return sorted(p for p in cache.iterdir() if diskcache.kind_of(p.name) in ((kind,) if kind else ("yaml", "tables")))


def assert_sound(cache: Path) -> None:
    """Every entry is a regular file with a header and checksum that hold (rebuilt where it was not)."""
    found = entries(cache)
    assert len(found) == WARM_ENTRIES["yaml"] + 1
    for entry in found:
        assert not entry.is_symlink() and diskcache._unwrap(entry.read_bytes(), entry.name.split("-")[0])


def assert_clean_run(tmp_path: Path, cache: Path, expected: str, **env: str) -> subprocess.CompletedProcess[str]:
    before = snapshot(tmp_path, cache)
    done = run(tmp_path, cache, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected and done.stderr == ""
    assert snapshot(tmp_path, cache) == before  # nothing outside the cache directory written, moved or made
    return done


class Plant:
    """Unpickled, it runs code: writes a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


def planted(kind: str, marker: Path) -> bytes:
    if kind.startswith("pickle"):
        data = pickle.dumps(Plant(marker))
    else:  # a code object, as a marshal file holds it
        data = marshal.dumps(compile(f"open({str(marker)!r}, 'w').write('ran')", "<planted>", "exec"))
    return data


@pytest.mark.parametrize("attack", ["pickle", "code", "pickle under a header that holds", "code under a header that holds"])
def test_a_planted_pickle_or_code_object_is_never_run(tmp_path: Path, cache: Path, expected: str, attack: str) -> None:
    marker = tmp_path / "user" / "ran.txt"
    payload = planted(attack, marker)
    targets = entries(cache)
    # the names earlier versions read (never read now): pickled tables, marshalled YAML and code
    targets += [cache / "tables-0123456789abcdef.pickle", cache / "yaml-01234567.marshal",
                cache / "dataclass-code-cpython-30b07f0-infersim.cards.model-01234567.marshal"]
    for entry in targets:
        kind = entry.name.split("-")[0]
        entry.write_bytes(diskcache._wrap(kind, payload) if "header" in attack else payload)
    assert_clean_run(tmp_path, cache, expected)
    assert not marker.exists()
    assert_sound(cache)


def test_a_link_at_an_entry_name_is_replaced_never_followed(tmp_path: Path, cache: Path, expected: str) -> None:
    precious = tmp_path / "user" / "thesis.txt"
    # a link to a well-formed entry outside the cache directory saying something else (an isl of 1024)
    config = next(e for e in entries(cache, "yaml") if b"qwen3-30b.yaml" in e.read_bytes().split(b"\n")[1][:400])
    forged = tmp_path / "user" / "forged.entry"
    payload = diskcache._unwrap(config.read_bytes(), "yaml")
    assert payload.count(b'"isl":4096') == 1
    forged.write_bytes(diskcache._wrap("yaml", payload.replace(b'"isl":4096', b'"isl":1024')))
    for entry in entries(cache):
        entry.unlink()
        entry.symlink_to(forged if entry == config else precious)
    assert_clean_run(tmp_path, cache, expected)
    assert precious.read_text() == "a user's file\n" and b'"isl":1024' in forged.read_bytes()
    assert_sound(cache)


def test_a_link_at_the_temporary_name_is_never_followed(tmp_path: Path, cache: Path, expected: str) -> None:
    """Every temporary name taken by a link (os.urandom made predictable): no entry is written, the
    linked file is unchanged, the run is right."""
    for entry in entries(cache):
        entry.unlink()
    precious = tmp_path / "user" / "thesis.txt"
    (cache / f".tmp-{'00' * 16}").symlink_to(precious)
    for pid in range(os.getpid(), os.getpid() + 50):  # the names earlier versions wrote through
        (cache / f"yaml-01234567.marshal.{pid}.partial").symlink_to(precious)
    before = snapshot(tmp_path, cache)
    prefix = ("-c", "import os, runpy; os.urandom = lambda n: bytes(n); runpy.run_module('infersim', run_name='__main__')")
    done = run(tmp_path, cache, *COMMAND[2:], prefix=prefix)
    assert done.returncode == 0 and done.stdout == expected and done.stderr == ""
    assert snapshot(tmp_path, cache) == before and precious.read_text() == "a user's file\n"
    assert entries(cache) == []


def test_a_users_files_in_the_cache_directory_survive_pruning_and_clearing(tmp_path: Path, cache: Path,
                                                                          expected: str) -> None:
    foreign = {"photo.jpg": os.urandom(300_000), "results.csv": b"a,b\n1,2\n", "notes.entry": b"mine",
               "yaml-0123.entry": b"not quite our name", "sub/inside.txt": b"nested", ".hidden": b"h"}
    for name, data in foreign.items():
        path = cache / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (1000.0, 1000.0))  # older than every entry: the first to go, were they InferSim's
    (cache / "yaml-0123456789abcdef.entry").symlink_to(tmp_path / "user" / "thesis.txt")
    assert_clean_run(tmp_path, cache, expected, INFERSIM_CACHE_MAX_MB="0.001")
    assert {name: (cache / name).read_bytes() for name in foreign} == foreign
    assert sum(p.stat().st_size for p in entries(cache)) <= 1000  # InferSim's own pruned under the cap
    done = run(tmp_path, cache, "-m", "infersim", "cache", "clear")
    assert done.returncode == 0 and "no other file is touched" in done.stdout
    assert {name: (cache / name).read_bytes() for name in foreign} == foreign and entries(cache) == []
    assert (tmp_path / "user" / "thesis.txt").read_text() == "a user's file\n"


@pytest.mark.parametrize("where", ["header", "first payload byte", "middle", "last byte", "torn"])
def test_flipped_bytes_are_a_miss_rebuilt(tmp_path: Path, cache: Path, expected: str, where: str) -> None:
    """Every entry of both kinds (the cards' YAML, the indexed tables) damaged alike in one run:
    each is read, found damaged and rebuilt."""
    damaged = entries(cache, "yaml") + entries(cache, "tables")
    assert len(damaged) == WARM_ENTRIES["yaml"] + 1
    for entry in damaged:
        data = bytearray(entry.read_bytes())
        header = data.index(b"\n")
        at = {"header": 5, "first payload byte": header + 1, "middle": (header + len(data)) // 2,
              "last byte": len(data) - 1}.get(where)
        if at is None:
            del data[len(data) // 2:]  # a write cut short
        else:
            data[at] ^= 0x10
        entry.write_bytes(bytes(data))
    assert_clean_run(tmp_path, cache, expected)
    assert_sound(cache)


@pytest.mark.parametrize("unsafe", ["o+w", "g+w", "symlink", "another owner"])
def test_a_directory_others_can_write_is_refused_with_one_warning(tmp_path: Path, cache: Path, expected: str,
                                                                  unsafe: str) -> None:
    for entry in entries(cache):
        entry.unlink()
    used = cache
    if unsafe == "symlink":
        used = tmp_path / "link-to-cache"
        used.symlink_to(cache)
    elif unsafe == "another owner":  # (test_cache_directory.py simulates it for any user)
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        os.chown(cache, os.getuid() + 1, -1)
    else:
        cache.chmod(0o700 | (0o002 if unsafe == "o+w" else 0o020))
    before = snapshot(tmp_path, cache)
    done = run(tmp_path, used)
    assert done.returncode == 0 and done.stdout == expected
    assert done.stderr.count(WARNING) == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    why = {"symlink": "it is a symbolic link", "another owner": f"it belongs to another user (uid {os.getuid() + 1})"}
    assert why.get(unsafe, "others can write to it") in done.stderr
    assert list(cache.iterdir()) == [] and snapshot(tmp_path, cache) == before  # nothing read or written


def test_cache_info_and_clear(tmp_path: Path, cache: Path) -> None:
    (cache / "photo.jpg").write_bytes(b"jpeg")
    (cache / "tables-0123456789abcdef.pickle").write_bytes(b"an earlier version's")
    info = run(tmp_path, cache, "-m", "infersim", "cache", "info")
    assert info.returncode == 0 and info.stderr == ""
    lines = info.stdout.splitlines()
    assert lines[0] == f"cache directory: {cache}" and "cap 256.00 MB" in lines[1]
    counts = {line.split()[0]: int(line.split()[-3]) for line in lines[2:-1]}
    assert counts == {"parsed": WARM_ENTRIES["yaml"], "indexed": 1, "entries": 1}
    size = sum(p.stat().st_size for p in cache.iterdir() if p.name != "photo.jpg")
    assert f"{size / 1e6:.2f} MB of InferSim's files" in lines[1]
    cleared = run(tmp_path, cache, "-m", "infersim", "cache", "clear")
    assert cleared.returncode == 0 and cleared.stdout.startswith(f"deleted {WARM_ENTRIES['yaml'] + 2} of InferSim's files ({size / 1e6:.2f} MB)")
    assert [p.name for p in cache.iterdir()] == ["photo.jpg"]
    assert "   0 " in run(tmp_path, cache, "-m", "infersim", "cache", "info").stdout
    off = run(tmp_path, None, "-m", "infersim", "cache", "info")
    assert off.stdout == "the on-disk cache is off (INFERSIM_CACHE=off)\n"
    cache.chmod(0o777)
    refused = run(tmp_path, cache, "-m", "infersim", "cache", "clear")
    assert refused.returncode == 2 and "not clearing the cache directory" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and (cache / "photo.jpg").exists()
    assert "not used: others can write to it (mode 0777)" in run(tmp_path, cache, "-m", "infersim", "cache", "info").stdout
