"""Measured kernel tables: format, lookup (the simulator's `KernelTables`), importer, harness.

    from infersim.tables import load_tables
    tables = load_tables(Path("mfu_tables/imported/h800"))
    hit = tables.lookup(GemmShape(4096, 7168, 1536, "fp8", "fp8"), peak_flops=1978.9e12)
"""

from infersim.tables.lookup import MfuTables, load_tables

__all__ = ["MfuTables", "load_tables"]
