"""The cache directory: where it is, who may own it, and how entries are written and read there."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from infersim.base import diskcache


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has not looked at its cache directory yet."""
    monkeypatch.setattr(diskcache, "_OPENED", {})
    monkeypatch.setenv("INFERSIM_CACHE", "on")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG location is Linux's")
def test_the_default_directory_is_the_users_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh) -> None:
    monkeypatch.delenv("INFERSIM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert diskcache.cache_dir() == str(tmp_path / "xdg" / "infersim")
    monkeypatch.setenv("INFERSIM_CACHE_DIR", "relative/dir")
    assert diskcache.cache_dir() == os.path.abspath("relative/dir")
    monkeypatch.setenv("INFERSIM_CACHE", "off")
    assert diskcache.cache_dir() is None


def test_the_directory_is_created_mode_0700(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh) -> None:
    root = tmp_path / "a" / "b" / "infersim"
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(root))
    old = os.umask(0)  # even where the umask would let others in
    try:
        diskcache.write_json("yaml-0000000000000001.entry", "yaml", {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "yaml-0000000000000001.entry").stat().st_mode) == 0o600
    assert diskcache.read_json("yaml-0000000000000001.entry", "yaml") == {"x": 1}


def test_another_users_directory_is_refused_with_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], fresh) -> None:
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(root))
    monkeypatch.setattr(diskcache, "_user_id", lambda: os.getuid() + 1)  # as if another user owned it
    for _ in range(3):
        diskcache.write_json("yaml-0000000000000001.entry", "yaml", {"x": 1})
        assert diskcache.read_json("yaml-0000000000000001.entry", "yaml") is None
    assert diskcache.prune(0) == [] and list(root.iterdir()) == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"infersim: warning: not using the cache directory {root}: it "
                                               f"belongs to another user (uid {os.getuid()})")


def test_a_writer_takes_another_random_name_where_one_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               fresh) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(root))
    root.mkdir(mode=0o700)
    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    names = iter([bytes(16), bytes(16), b"\x01" * 16])
    monkeypatch.setattr(os, "urandom", lambda n: next(names))
    (root / f".tmp-{'00' * 16}").symlink_to(precious)
    diskcache.write_json("yaml-0000000000000001.entry", "yaml", {"x": 1})
    assert precious.read_text() == "mine" and diskcache.read_json("yaml-0000000000000001.entry", "yaml") == {"x": 1}
    assert os.readlink(root / f".tmp-{'00' * 16}") == str(precious)


@pytest.mark.parametrize("thing", ["fifo", "directory", "empty file"])
def test_something_else_at_an_entry_name_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh,
                                                   thing: str) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(root))
    name = "yaml-0000000000000001.entry"
    if thing == "fifo":
        os.mkfifo(root / name)  # opened without O_NONBLOCK, a read would wait for a writer forever
    elif thing == "directory":
        (root / name).mkdir()
    else:
        (root / name).write_bytes(b"")
    assert diskcache.read_json(name, "yaml") is None
    diskcache.write_json(name, "yaml", [1])
    assert diskcache.read_json(name, "yaml") == ([1] if thing != "directory" else None)


def test_only_infersims_names_are_written_and_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh) -> None:
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path))
    for name in ("../escape.entry", "photo.jpg", "yaml-1.entry", "tables-0000000000000001.entry"):
        with pytest.raises(ValueError, match="not a cache entry name"):
            diskcache.write_entry(name, "yaml", b"x")
    (tmp_path / "photo.jpg").write_bytes(b"x")
    diskcache.discard("photo.jpg")
    assert (tmp_path / "photo.jpg").exists()
    assert [diskcache.kind_of(n) for n in ("yaml-0123456789abcdef.entry", "tables-0123456789abcdef.entry",
                                           f".tmp-{'ab' * 16}", "yaml-01234567.marshal", "tables-0123456789abcdef.pickle",
                                           "tables-0123456789abcdef.4242.partial", "yaml-01234567.marshal.17.partial",
                                           "photo.jpg", "yaml-0123456789abcdef.entry.bak", "x.marshal")] == \
        ["yaml", "tables", "unfinished write", "earlier version", "earlier version", "earlier version",
         "earlier version", None, None, None]


def test_an_entry_of_another_kind_or_format_is_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh) -> None:
    monkeypatch.setenv("INFERSIM_CACHE_DIR", str(tmp_path))
    name = "yaml-0000000000000001.entry"
    diskcache.write_entry(name, "yaml", b"[1]")
    data = (tmp_path / name).read_bytes()
    assert data.startswith(b"infersim-cache-1 yaml ") and diskcache.read_entry(name, "tables") is None
    assert not (tmp_path / name).exists()  # deleted
    (tmp_path / name).write_bytes(data.replace(b"cache-1", b"cache-2"))
    assert diskcache.read_entry(name, "yaml") is None and not (tmp_path / name).exists()
    (tmp_path / name).write_bytes(data + b" ")
    assert diskcache.read_entry(name, "yaml") is None
    diskcache.write_entry(name, "yaml", b"[1")  # a header that holds, over what JSON refuses
    assert diskcache.read_json(name, "yaml") is None and not (tmp_path / name).exists()


def test_settings_it_cannot_read_are_said_not_guessed(monkeypatch: pytest.MonkeyPatch, capsys, fresh) -> None:
    monkeypatch.setattr(diskcache, "_WARNED", set())
    monkeypatch.setenv("INFERSIM_CACHE_MAX_MB", "bogus")
    assert diskcache.max_bytes() == 256e6
    monkeypatch.setenv("INFERSIM_CACHE_MAX_MB", "-5")
    assert diskcache.max_bytes() == 256e6
    monkeypatch.setenv("INFERSIM_CACHE_MAX_MB", "64")
    assert diskcache.max_bytes() == 64e6
    monkeypatch.setenv("INFERSIM_CACHE", "maybe")
    monkeypatch.setenv("INFERSIM_CACHE_DIR", "/somewhere")
    assert diskcache.cache_dir() == "/somewhere"
    diskcache.cache_dir()  # said once
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "infersim: warning: INFERSIM_CACHE_MAX_MB='bogus' is not a positive number of MB; the cache is held to the "
        "default 256 MB",
        "infersim: warning: INFERSIM_CACHE_MAX_MB='-5' is not a positive number of MB; the cache is held to the "
        "default 256 MB",
        "infersim: warning: INFERSIM_CACHE='maybe' is neither off (0, off, no, false) nor on (1, on, yes, true); "
        "the on-disk cache stays on",
    ]
