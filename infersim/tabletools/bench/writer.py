"""Writing a table directory while `mfu bench` measures it, row by row.

A real GPU run ends in many ways: its time budget, the command's time limit (SIGTERM, then SIGKILL),
out-of-memory, a kernel that raises. So nothing waits for the end: the provenance is written before
the first kernel (complete: false), each row is appended to its CSV and flushed as soon as it is
measured, and the provenance is rewritten (atomically) whenever a table or a library appears, so the
directory loads at any moment with every row measured so far. `finish` records the notes (what was not
measured and why) and marks it complete. Every value goes through `table_files.plain` (a TorchVersion is a
str subclass that yaml.safe_dump refuses: that one value once lost a whole H100 run).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from collections.abc import Sequence

from infersim.base.errors import InferSimError
from infersim.tables.output import clear_own_tables
from infersim.tables.format import FORMAT_VERSION, PROVENANCE_FILE, DeviceInfo, Provenance, Row, TableInfo
from infersim.tables.table_files import measured_columns, plain, provenance_yaml_text, row_cells

TABLE_DESCRIPTIONS = {
    "gemm": "dense GEMM C = A @ W^T as nn.Linear runs it, over M, for each (K, N) of the model cards and of the "
            "comparison grid",
    "grouped_gemm": "routed-expert grouped GEMM over all local experts with row offsets, balanced routing: 'up' is "
                    "gate+up fused (n = 2 x intermediate), 'down' the down projection; one kernel serves both "
                    "stages, so each timing is written as a prefill and a decode row",
    "attention": "torch SDPA in HF transformers' layouts; prefill: one causal prompt of q_len = kv_len tokens "
                 "(batch 1); decode: one query token per sequence over kv_len cached tokens",
    "elementwise": "eager PyTorch elementwise, reduction and copy kernels (infersim.shapes.kernels.ELEMENTWISE_OPS) "
                   "over sizes from a few hundred elements to a few hundred million; bytes by the op's byte rule",
}


@dataclass
class _Table:
    family: str
    libraries: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    rows: int = 0


class TableWriter:
    """A table directory being written as it is measured (see the module docstring)."""

    def __init__(self, directory: Path, device: DeviceInfo, software: dict[str, str], peaks: dict[str, float],
                 command: str, measured_on: str, notes: Sequence[str] = (), force: bool = False) -> None:
        self.directory = Path(directory)
        self.device = device
        self.software = {str(k): str(plain(v)) for k, v in software.items()}
        self.peaks = {str(k): float(v) for k, v in peaks.items()}
        self.command = str(plain(command))
        self.measured_on = measured_on
        self.notes: list[str] = [str(plain(n)) for n in notes]
        self.host: dict[str, float] = {}
        self.launch_cpu: float | None = None
        self.step_cpu: float | None = None
        self.host_source = ""
        self.tables: dict[str, _Table] = {}
        self._handles: dict[str, tuple[IO[str], list[str]]] = {}
        clear_own_tables(self.directory, force)  # before anything is measured: a refused --out costs nothing
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_provenance(complete=False)

    # -- rows

    def add(self, name: str, family: str, rows: Sequence[Row], library: str, library_version: str = "") -> None:
        """Append `rows` to table `name` (created with its header on first use) and flush them."""
        table = self.tables.get(name)
        changed = table is None
        if table is None:
            table = self.tables[name] = _Table(family)
        elif table.family != family:
            raise InferSimError(f"{self.directory / name}: a {table.family} table got {family} rows")
        for value, seen in ((library, table.libraries), (library_version, table.versions)):
            if value and value not in seen:
                seen.append(str(plain(value)))
                changed = True
        handle, columns = self._handle(name, family)
        writer = csv.writer(handle, lineterminator="\n")
        for row in rows:
            writer.writerow(row_cells(family, row, columns, self._peak))
        handle.flush()
        table.rows += len(rows)
        if changed:  # the provenance must list every CSV present, or the directory would not load
            self.write_provenance(complete=False)

    def _peak(self, dtype: str) -> float:
        try:
            return self.peaks[dtype]
        except KeyError:
            raise InferSimError(f"no peak FLOP/s for {dtype} on {self.device.name}: give --peak-{dtype} or "
                                f"--hardware") from None

    def _handle(self, name: str, family: str) -> tuple[IO[str], list[str]]:
        if name not in self._handles:
            columns = measured_columns(family)
            handle = (self.directory / name).open("w", newline="", encoding="utf-8")
            csv.writer(handle, lineterminator="\n").writerow(columns)
            self._handles[name] = (handle, columns)
        return self._handles[name]

    # -- provenance

    def set_host(self, probes: dict[str, float], launch_cpu: float | None, step_cpu: float | None,
                 source: str) -> None:
        self.host.update({str(k): float(v) for k, v in probes.items()})
        self.launch_cpu, self.step_cpu, self.host_source = launch_cpu, step_cpu, str(plain(source))
        self.write_provenance(complete=False)

    def provenance(self, complete: bool) -> Provenance:
        infos = {name: TableInfo(family=t.family, library="; ".join(t.libraries),  # type: ignore[arg-type]
                                 library_version="; ".join(t.versions) or self.software.get("torch", "unknown"),
                                 description=TABLE_DESCRIPTIONS.get(t.family, ""))
                 for name, t in sorted(self.tables.items())}
        return Provenance(format_version=FORMAT_VERSION, device=self.device, peak_flops=dict(self.peaks),
                          origin="measured", measured_on=self.measured_on, written_on=self.measured_on,
                          command=self.command, software=dict(self.software), notes=tuple(self.notes),
                          launch_cpu=self.launch_cpu, step_cpu=self.step_cpu, host_source=self.host_source,
                          host_probes=dict(self.host), complete=complete, tables=infos)

    def write_provenance(self, complete: bool) -> None:
        text = provenance_yaml_text(self.provenance(complete))
        temporary = self.directory / (PROVENANCE_FILE + ".partial")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, self.directory / PROVENANCE_FILE)  # atomic: a reader never sees half a file

    def finish(self, notes: Sequence[str] = (), complete: bool = True) -> None:
        """Close the CSVs and write the final provenance with `notes` added."""
        self.notes += [str(plain(n)) for n in notes]
        for handle, _columns in self._handles.values():
            handle.close()
        self._handles.clear()
        self.write_provenance(complete=complete)
