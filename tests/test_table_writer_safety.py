"""A table writer deletes or replaces only files it can prove it wrote, and only with --force.

The attacks: a planted provenance.yaml naming `../x`, an absolute path or a symlink; a user's own
provenance.yaml that is no table provenance; foreign files beside the tables; --out a regular file;
a table set that fails the number rule. Each ends with every file outside the directory (and every
foreign file inside it) byte for byte as it was.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from infersim.base.errors import InferSimError
from infersim.tables.format import PROVENANCE_FILE, TableDirectory
from infersim.tables.format import GemmRow
from infersim.tables.output import is_plain_table_name, owned_tables, write_table_dir
from infersim.tables.table_files import provenance_yaml_text, read_table_dir
from test_mfu_format import sample_directory


def smaller(directory: TableDirectory) -> TableDirectory:
    return TableDirectory(replace(directory.provenance, tables={"gemm.csv": directory.provenance.tables["gemm.csv"]}),
                          {"gemm.csv": directory.tables["gemm.csv"]})


def plant_provenance(out: Path, extra_tables: dict[str, str]) -> None:
    """A provenance in InferSim's own format whose table list also names `extra_tables` (name -> family)."""
    directory = sample_directory()
    infos = dict(directory.provenance.tables)
    for name, family in extra_tables.items():
        infos[name] = replace(infos["gemm.csv"], family=family)
    out.mkdir(exist_ok=True)
    (out / PROVENANCE_FILE).write_text(provenance_yaml_text(replace(directory.provenance, tables=infos)))


@pytest.mark.parametrize("name", ["../notes.txt", "../victim.csv", "sub/x.csv", "..", "/etc/x.csv", "a\\b.csv",
                                  ".hidden.csv", "notes.txt"])
def test_only_plain_csv_names_count_as_tables(name: str) -> None:
    assert not is_plain_table_name(name)
    assert is_plain_table_name("gemm_bf16.csv")


def test_a_planted_provenance_cannot_delete_outside_the_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim.csv"
    victim.write_text("keep me\n")
    absolute = tmp_path / "abs.csv"
    absolute.write_text("keep me too\n")
    target = tmp_path / "target.csv"
    target.write_text("the link's target\n")
    out = tmp_path / "tables"
    plant_provenance(out, {"../victim.csv": "gemm", str(absolute): "gemm", "link.csv": "gemm"})
    (out / "link.csv").symlink_to(target)
    assert owned_tables(out) == set()  # none of the three is a table InferSim can have written
    with pytest.raises(InferSimError, match="'link.csv', a CSV InferSim did not write"):
        write_table_dir(out, smaller(sample_directory()), force=True)
    (out / "link.csv").unlink()
    write_table_dir(out, smaller(sample_directory()), force=True)
    assert victim.read_text() == "keep me\n" and absolute.read_text() == "keep me too\n"
    assert target.read_text() == "the link's target\n"
    assert read_table_dir(out).tables == smaller(sample_directory()).tables


def test_rewriting_replaces_own_tables_and_leaves_foreign_files(tmp_path: Path) -> None:
    directory = sample_directory()
    write_table_dir(tmp_path / "t", directory)
    (tmp_path / "t" / "README.md").write_text("my notes\n")
    with pytest.raises(InferSimError, match="already holds kernel tables.*--force"):
        write_table_dir(tmp_path / "t", smaller(directory))
    write_table_dir(tmp_path / "t", smaller(directory), force=True)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["README.md", "gemm.csv", PROVENANCE_FILE]
    assert read_table_dir(tmp_path / "t").tables == smaller(directory).tables
    (tmp_path / "t" / "mine.csv").write_text("x\n")
    with pytest.raises(InferSimError, match="'mine.csv', a CSV InferSim did not write"):
        write_table_dir(tmp_path / "t", directory, force=True)
    assert (tmp_path / "t" / "mine.csv").read_text() == "x\n"


def test_a_directory_that_is_not_a_table_directory_needs_force(tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / PROVENANCE_FILE).write_text("my own provenance notes: not a table provenance\n")
    with pytest.raises(InferSimError, match="not empty and is not a kernel-table directory.*--force"):
        write_table_dir(tmp_path, sample_directory())
    assert (tmp_path / PROVENANCE_FILE).read_text().startswith("my own provenance")
    with pytest.raises(InferSimError, match="holds 'provenance.yaml', a file InferSim did not write"):
        write_table_dir(tmp_path, sample_directory(), force=True)  # not InferSim's to replace, even with --force
    assert (tmp_path / PROVENANCE_FILE).read_text().startswith("my own provenance")
    (tmp_path / PROVENANCE_FILE).unlink()
    write_table_dir(tmp_path, sample_directory(), force=True)
    assert (tmp_path / "photo.jpg").read_bytes() == b"\xff\xd8"
    assert read_table_dir(tmp_path).provenance == sample_directory().provenance


def test_out_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tables"
    path.write_text("a file\n")
    with pytest.raises(InferSimError, match="is a file, not a directory"):
        write_table_dir(path, sample_directory(), force=True)
    assert path.read_text() == "a file\n"


def test_a_set_failing_the_number_rule_leaves_the_old_tables_and_no_residue(tmp_path: Path) -> None:
    out = tmp_path / "t"
    write_table_dir(out, sample_directory())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = sample_directory()
    rows = (GemmRow("bf16", 16, 4096, 4096, math.inf),)
    bad = TableDirectory(bad.provenance, {**bad.tables, "gemm.csv": rows})
    with pytest.raises(InferSimError, match="do not pass the table checks, nothing was written"):
        write_table_dir(out, bad, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no staging directory left behind


def test_a_symlinked_table_name_is_never_written_through(tmp_path: Path) -> None:
    out = tmp_path / "t"
    write_table_dir(out, sample_directory())
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (out / "gemm.csv").unlink()
    (out / "gemm.csv").symlink_to(victim)
    with pytest.raises(InferSimError, match="'gemm.csv', a CSV InferSim did not write"):
        write_table_dir(out, sample_directory(), force=True)
    assert victim.read_text() == "keep\n"
    (out / "gemm.csv").unlink()
    (out / "gemm.csv").mkdir()  # a directory under a table's name: never replaced
    with pytest.raises(InferSimError, match="gemm.csv"):
        write_table_dir(out, sample_directory(), force=True)
    assert (out / "gemm.csv").is_dir()
