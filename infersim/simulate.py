"""One simulation: a RunConfig in, prefill and decode results, memory and warnings out."""

from __future__ import annotations

from dataclasses import dataclass

from infersim.config import RunConfig
from infersim.engine import StageResult, run_stage
from infersim.kernels import NoTables, Source
from infersim.memory import MemoryResult, memory_budget
from infersim.modules import categories as cat
from infersim.modules.step import build_stage_plan
from infersim.speculative import SpeculativeResult, drafter_memory, run_speculative
from infersim.units import GB


@dataclass(frozen=True)
class SimulationResult:
    config: RunConfig
    prefill: StageResult
    decode: StageResult
    memory: MemoryResult
    warnings: tuple[str, ...]
    # speculative decoding (run config section `speculative`): then `decode` is the speculative
    # step (drafting + verification; decode.tpot_s is the effective TPOT) and `prefill` includes
    # the drafter's prefill
    speculative: SpeculativeResult | None = None


def decode_batch(config: RunConfig, memory: MemoryResult) -> int:
    requested = config.workload.decode_batch_per_gpu
    if requested == "max":
        # two-batch overlap splits the batch in two equal micro-batches
        step = 2 if config.deployment.overlap == "two-batch" else 1
        return max(memory.max_batch_per_gpu // step * step, step)
    return requested


def simulate(config: RunConfig) -> SimulationResult:
    model, hw, dep, workload = config.model, config.hardware, config.deployment, config.workload
    speculative = None
    memory = memory_budget(model, hw, dep, workload, drafter_memory(config))
    batch = decode_batch(config, memory)
    sms = hw.derates.deepep_normal_sms
    prefill = run_stage(build_stage_plan("prefill", model, dep, workload, workload.prefill_tokens, sms), hw, config.tables)
    if config.speculative is not None:
        prefill, decode, speculative = run_speculative(config, prefill, batch)
    else:
        decode = run_stage(build_stage_plan("decode", model, dep, workload, batch, sms), hw, config.tables)
    return SimulationResult(config, prefill, decode, memory, tuple(_warnings(config, memory, batch, prefill, decode)),
                            speculative)


def _table_device_mismatch(config: RunConfig) -> str:
    """A warning when the kernel tables were measured on another GPU than the hardware card's."""
    provenance = getattr(config.tables, "provenance", None)
    if provenance is None:
        return ""
    device = "".join(ch for ch in provenance.device.name.lower() if ch.isalnum())
    model_tokens = [t for t in config.hardware.name.lower().split("-") if any(ch.isdigit() for ch in t)]
    if model_tokens and all(token in device for token in model_tokens[:1]):
        return ""
    return (f"kernel tables measured on {provenance.device.name} are used for hardware card {config.hardware.name}: "
            "table times are that device's, not this one's")


def _warnings(config: RunConfig, memory: MemoryResult, batch: int, *stages: StageResult) -> list[str]:
    out: list[str] = []
    workload = config.workload
    if isinstance(config.tables, NoTables):
        out.append("no measured MFU tables in use: every kernel time is a roofline estimate "
                   "(max of compute and memory time with the hardware card's derates, plus launch overhead)")
    else:
        # tables cover GEMMs, grouped GEMMs and attention; elementwise kernels are always roofline
        fallback = sorted({op.name for s in stages for op in s.operations if op.source == Source.ROOFLINE
                           and op.flops > 0 and op.module not in cat.COMMUNICATION
                           and op.module not in (cat.ELEMENTWISE, cat.EMBEDDING)
                           and not op.detail.startswith("outside table")})
        if fallback:
            out.append("no table covers these kernels, roofline fallback used: " + ", ".join(fallback))
        mismatch = _table_device_mismatch(config)
        if mismatch:
            out.append(mismatch)
        edges = sorted({op.detail for s in stages for op in s.operations if op.detail.startswith("outside table")})
        out.extend(edges)
    if memory.kv_capacity_bytes <= 0:
        out.append(f"does not fit: weights need {memory.weights_bytes / GB:.2f} GB per GPU, but the GPU has "
                   f"{memory.hbm_bytes / GB:.2f} GB of which the runtime reserves {memory.reserved_bytes / GB:.2f} GB")
    elif memory.max_batch_per_gpu < 1:
        out.append(f"does not fit: one request of {memory.request_context} tokens needs more KV cache than the "
                   f"{memory.kv_capacity_bytes / GB:.2f} GB left per GPU")
    elif workload.decode_batch_per_gpu != "max" and batch > memory.max_batch_per_gpu:
        out.append(f"decode batch {batch} per GPU exceeds the {memory.max_batch_per_gpu} requests of "
                   f"{memory.request_context} tokens whose KV cache fits ({memory.kv_capacity_bytes / GB:.2f} GB per GPU)")
    if workload.decode_batch_per_gpu == "max":
        out.append(f"decode batch per GPU not given: using the largest that fits in memory ({batch}"
                   + (", even for two-batch overlap)" if config.deployment.overlap == "two-batch" else ")"))
    rest = workload.prefill_tokens % workload.isl
    if rest and workload.prefill_tokens > workload.isl:
        out.append(f"prefill tokens per GPU ({workload.prefill_tokens}) is not a multiple of ISL ({workload.isl}): "
                   f"the last {rest} tokens are modelled as one shorter sequence")
    return out
