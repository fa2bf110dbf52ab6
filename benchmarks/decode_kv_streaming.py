"""The HBM rate decode attention streams its KV cache at, per GPU, from the bundled decode tables:
the share of the hardware card's peak HBM bandwidth that one more cached token per sequence costs.

    python benchmarks/decode_kv_streaming.py [TABLE_DIR ...]   # default: every bundled TensorRT-LLM set

Between two measured context lengths of one row (one batch, head layout, KV dtype), both at 1,024
tokens or more and at least 1.5x apart, and moving at least 200 MB more (the kernel is then streaming
its cache, not waiting on launch and reduction latency), the extra KV bytes over the extra time are
the rate the kernel reads its cache at:

    batch x (kv_b - kv_a) x num_kv_heads x head_dim x 2 (K and V) x bytes per element / (t_b - t_a)

The median over every such pair is what a hardware card's `memory_efficiency` states for attention and
GEMM weight streaming (infersim.costing.timing: the roofline's achievable bytes per second, and the
floor of a table row extended above its range, infersim.tables.beyond_range.hbm_floor).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infersim.run.config import load_hardware_card
from infersim.tables.format import AttentionRow
from infersim.tables.table_files import read_table_dir

#: a pair of context lengths counts from here (the kernel streams; below it latency dominates)
MIN_KV_LEN = 1024
MIN_EXTRA_BYTES = 2e8
MIN_STEP = 1.5


def kv_bytes_per_token(row: AttentionRow) -> float:
    element = 1.0 if row.kv_dtype in ("fp8", "int8") else 2.0
    return row.num_kv_heads * (row.qk_head_dim + row.v_head_dim) * element


def streaming_shares(directory: Path, hbm_bandwidth: float) -> dict[str, list[float]]:
    """{'<kv dtype> <mha|gqa>': shares of peak HBM bandwidth} over the decode rows of one table set."""
    lines: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    per_token: dict[tuple, float] = {}
    for rows in read_table_dir(directory).tables.values():
        for row in rows:
            if not isinstance(row, AttentionRow) or row.stage != "decode" or row.kind != "mha" or row.window:
                continue
            key = (row.kv_dtype, row.num_heads, row.num_kv_heads, row.qk_head_dim, row.v_head_dim, row.batch)
            lines[key][row.kv_len].append(row.latency_us * 1e-6)
            per_token[key] = kv_bytes_per_token(row) * row.batch
    shares: dict[str, list[float]] = defaultdict(list)
    for key, times in lines.items():
        layout = f"{key[0]} {'mha' if key[1] == key[2] else 'gqa'}"
        lengths = sorted(times)
        for low, high in zip(lengths, lengths[1:]):
            extra = per_token[key] * (high - low)
            seconds = statistics.fmean(times[high]) - statistics.fmean(times[low])
            if low >= MIN_KV_LEN and high >= MIN_STEP * low and extra >= MIN_EXTRA_BYTES and seconds > 0:
                shares[layout].append(extra / seconds / hbm_bandwidth)
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", type=Path)
    args = parser.parse_args()
    directories = args.directories or sorted((REPO / "mfu_tables" / "aiconfigurator").glob("*/trtllm-*"))
    for directory in directories:
        hardware, _ = load_hardware_card(directory.parent.name)  # mfu_tables/aiconfigurator/<hardware card>/<engine>
        shares = streaming_shares(directory, hardware.peak.hbm_bandwidth)
        every = [share for values in shares.values() for share in values]
        if not every:
            continue
        print(f"{directory.relative_to(REPO) if directory.is_relative_to(REPO) else directory}: "
              f"{hardware.name} ({hardware.peak.hbm_bandwidth / 1e12:g} TB/s): median {statistics.median(every):.3f} "
              f"of {len(every)} pairs; card memory_efficiency {hardware.derates.memory_efficiency:g}")
        for layout, values in sorted(shares.items()):
            quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
            print(f"  {layout:9s} n {len(values):4d}  median {quartiles[1]:.3f}  p25 {quartiles[0]:.3f}  "
                  f"p75 {quartiles[2]:.3f}")


if __name__ == "__main__":
    main()
