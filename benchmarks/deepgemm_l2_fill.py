"""How many bytes DeepGEMM's fp8 kernels pull from L2 into shared memory, per second of measured time.

The evidence behind the DeepGEMM masked-layout outliers of `infersim validate`: for every
shape of DeepGEMM's README performance table (commit 78cacf7, H800 SXM5, 132 SMs) this script
re-derives the tile configuration DeepGEMM's own heuristic picks (deep_gemm/jit_kernels/gemm.py
`get_best_configs` at that commit: BLOCK_M 64 or 128, the BLOCK_N in 16..128 with the fewest waves
and the fullest last wave, TMA multicast of the A tile over 2 CTAs only for one group with M >= 1024),
counts what the tiles load (every tile streams BLOCK_M x K of A, shared by the cluster under
multicast, and BLOCK_N x K of B, one byte per fp8 element) and divides by the measured time.

At K = 7168 every kernel that fills the machine (M = 4096 dense, the contiguous and the masked
layouts) moves 7.2-8.9 TB/s: a common ceiling on the fill, which the 4-group masked kernel, without
multicast and so with 1.33x the bytes of its single-group twin, meets at 0.47 of fp8 peak (measured
1.32x the time). At K = 2048 the relation is looser (5.7-7.7 TB/s); small-M kernels are bound by
HBM and latency instead. Not a model: InferSim does not price this bound yet (no L2-to-SM bandwidth
from an independent source).

Run: python benchmarks/deepgemm_l2_fill.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infersim.run.config import load_hardware_card  # noqa: E402

H800 = load_hardware_card("h800")[0]  # the GPU DeepGEMM's table was measured on: its SM count and fp8 peak

# (layout, groups, M per group, N, K, measured TFLOPS): DeepGEMM README 'Performance' at 78cacf7
SHAPES = [
    ("normal", 1, 64, 2112, 7168, 206), ("normal", 1, 64, 24576, 1536, 289), ("normal", 1, 64, 32768, 512, 219),
    ("normal", 1, 64, 7168, 16384, 336), ("normal", 1, 64, 4096, 7168, 287), ("normal", 1, 64, 7168, 2048, 295),
    ("normal", 1, 128, 2112, 7168, 352), ("normal", 1, 128, 24576, 1536, 535), ("normal", 1, 128, 32768, 512, 358),
    ("normal", 1, 128, 7168, 16384, 645), ("normal", 1, 128, 4096, 7168, 533), ("normal", 1, 128, 7168, 2048, 510),
    ("normal", 1, 4096, 2112, 7168, 1058), ("normal", 1, 4096, 24576, 1536, 990), ("normal", 1, 4096, 32768, 512, 590),
    ("normal", 1, 4096, 7168, 16384, 1358), ("normal", 1, 4096, 4096, 7168, 1304), ("normal", 1, 4096, 7168, 2048, 1025),
    ("contiguous", 4, 8192, 4096, 7168, 1297), ("contiguous", 4, 8192, 7168, 2048, 1099),
    ("contiguous", 8, 4096, 4096, 7168, 1288), ("contiguous", 8, 4096, 7168, 2048, 1093),
    ("masked", 1, 1024, 4096, 7168, 1233), ("masked", 1, 1024, 7168, 2048, 925),
    ("masked", 2, 512, 4096, 7168, 1040), ("masked", 2, 512, 7168, 2048, 916),
    ("masked", 4, 256, 4096, 7168, 932), ("masked", 4, 256, 7168, 2048, 815),
]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tile_config(m: int, n: int, groups: int, contiguous: bool, sms: int = H800.peak.sm_count) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, TMA multicast, waves) as DeepGEMM's get_best_configs (78cacf7) picks them;
    the contiguous layout is called with the groups' rows merged and one group."""
    block_m = 128 if contiguous or m > 64 else 64

    def tiles(block_n: int) -> int:
        return ceil_div(m, block_m) * ceil_div(n, block_n) * groups

    def last_wave(block_n: int) -> int:
        return tiles(block_n) % sms or sms

    best = 16
    for block_n in range(16, 129, 8):
        waves, best_waves = ceil_div(tiles(block_n), sms), ceil_div(tiles(best), sms)
        if waves < best_waves or (waves == best_waves and (
                last_wave(block_n) > last_wave(best) or (last_wave(block_n) == last_wave(best) and block_n >= best))):
            best = block_n
    multicast = 2 if m >= 1024 and n % (best * 2) == 0 and sms % 2 == 0 and groups == 1 else 1
    return block_m, best, multicast, ceil_div(tiles(best), sms)


def fill_bytes(layout: str, groups: int, m: int, n: int, k: int) -> tuple[tuple[int, int, int, int], float]:
    """(tile config, bytes the tiles load from L2 into shared memory) of one table shape: every tile
    streams BLOCK_M x K of A (shared by the cluster under multicast) and BLOCK_N x K of B, fp8."""
    contiguous = layout == "contiguous"
    rows, kernel_groups = (groups * m, 1) if contiguous else (m, groups)
    config = tile_config(rows, n, kernel_groups, contiguous)
    block_m, block_n, multicast, _ = config
    tiles = ceil_div(rows, block_m) * ceil_div(n, block_n) * kernel_groups
    return config, tiles * k * (block_m / multicast + block_n)


def main() -> None:
    print(f"{'layout':10s} {'G':>2s} {'M':>5s} {'N':>6s} {'K':>6s}  {'tile':>8s} {'mc':>2s} {'waves':>5s}  "
          f"{'us':>7s}  {'L2->SMEM MB':>11s}  {'TB/s':>5s}  {'of fp8 peak':>11s}")
    for layout, groups, m, n, k, tflops in SHAPES:
        (block_m, block_n, multicast, waves), loaded = fill_bytes(layout, groups, m, n, k)
        seconds = 2 * groups * m * n * k / (tflops * 1e12)
        print(f"{layout:10s} {groups:2d} {m:5d} {n:6d} {k:6d}  {block_m:3d}x{block_n:<4d} {multicast:2d} {waves:5d}  "
              f"{seconds * 1e6:7.1f}  {loaded / 1e6:11.1f}  {loaded / seconds / 1e12:5.2f}  "
              f"{tflops * 1e12 / H800.peak_flops('fp8'):11.2f}")


if __name__ == "__main__":
    main()
