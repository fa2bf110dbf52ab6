"""What crosses the host link in one forward pass, and how the runtime overlaps it with compute.

A forward pass is a sequence of units (embedding, each layer, final norm + LM head). With weights
offloaded every unit's weights are fetched from host memory (or NVMe) before it runs; with the KV
cache offloaded every layer's past keys and values are fetched too, and the new entries go back.
The runtime fetches one unit ahead (ZeRO-3 prefetch with two buffers), so a pass takes about the
first unit's transfer plus, per unit, the larger of its compute and the next unit's transfer.

The `generate` subcommand's offload (whole layers, ZeRO-Inference) and the stage engine's partial
weight offload (infersim.costing.weight_offload) both price their passes with this schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infersim.shapes.kernels import AnyShape, GemmShape, GroupedGemmShape
from infersim.base.units import dtype_bytes


@dataclass(frozen=True)
class PassUnit:
    """One fetch-then-compute unit of a forward pass: a layer, the embedding or the LM head."""

    name: str
    compute_s: float  # GPU time once its inputs are on the GPU (dequantization included)
    h2d_s: float = 0.0  # host-to-device transfer it waits for (weights and/or past KV)
    d2h_s: float = 0.0  # device-to-host transfer after it ran (new KV entries to host memory)
    weight_bytes: float = 0.0  # stored weight bytes fetched for it (0 when weights are resident)
    kv_bytes: float = 0.0  # past KV bytes fetched for it
    kv_out_bytes: float = 0.0  # new KV bytes written back to the host


def prefetch_schedule(units: Sequence[PassUnit], prefetch: bool = True) -> float:
    """Makespan of one pass: transfers run in order on the host-to-device link, computes in order on
    the GPU, new KV in order on the device-to-host link (PCIe is full duplex and GPUs have separate
    copy engines per direction). A unit computes once its transfer is done. With prefetch there are
    two transfer buffers, so unit i's transfer may start once unit i-2 has computed; without it, one
    buffer: fetch, compute, fetch, compute."""
    link_free = 0.0  # host-to-device link
    back_free = 0.0  # device-to-host link
    done_prev = done_prev2 = 0.0  # compute end of units i-1 and i-2
    for unit in units:
        buffer_free = done_prev2 if prefetch else done_prev
        link_free = max(link_free, buffer_free) + unit.h2d_s
        done = max(done_prev, link_free) + unit.compute_s
        back_free = max(back_free, done) + unit.d2h_s
        done_prev2, done_prev = done_prev, done
    return max(done_prev, back_free)


def weight_elements(shape: AnyShape) -> float:
    """Weight elements a kernel reads: the whole matrix of a GEMM, every local expert of a grouped
    GEMM (a fetch brings all experts, not only those the batch routes to); 0 for other kernels."""
    if isinstance(shape, GemmShape):
        return float(shape.k * shape.n)
    if isinstance(shape, GroupedGemmShape):
        return float(shape.local_experts * shape.k * shape.n)
    return 0.0


def is_weight_only_quantized(weight_dtype: str, gemm_dtype: str) -> bool:
    """Weights stored narrower than the GEMM input format must be dequantized before the GEMM."""
    return dtype_bytes(weight_dtype) < dtype_bytes(gemm_dtype)


def stored_bytes_per_weight(weight_dtype: str, gemm_dtype: str, group_size: int, group_bytes: float) -> float:
    """Bytes one weight occupies in storage: its format plus its share of the group's scale and zero
    point when it is weight-only quantized (group-wise int4/int8 keeps those next to the weights)."""
    per = dtype_bytes(weight_dtype)
    if is_weight_only_quantized(weight_dtype, gemm_dtype):
        per += group_bytes / group_size
    return per


def transfer_seconds(weight_bytes: float, kv_bytes: float, pcie_bytes_per_s: float,
                     nvme_bytes_per_s: float = 0.0) -> float:
    """Host-to-device time for one unit. Weights on NVMe are read into pinned host buffers and copied
    on in chunks, so the two links pipeline and the slower one sets the time; the KV cache always
    comes from host memory over the same PCIe link as the weights."""
    over_pcie = (weight_bytes + kv_bytes) / pcie_bytes_per_s
    if nvme_bytes_per_s > 0:
        return max(weight_bytes / nvme_bytes_per_s, over_pcie)
    return over_pcie
