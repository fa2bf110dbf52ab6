"""Unit conversions at the edges. Inside the simulator everything is SI: FLOP, bytes, seconds."""

GB = 1e9  # decimal gigabyte, used for every "_gb" output field
GIB = 2**30  # binary gibibyte, only where a field name says "gib"
MS = 1e-3
US = 1e-6
TERA = 1e12

#: bytes per element for each numeric format the simulator knows
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
}


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


#: activations travel between kernels in bf16 in every serving engine modelled here
ACT_BYTES = DTYPE_BYTES["bf16"]


def round_up(value: float, step: int) -> int:
    """`value` rounded up to a whole number of `step`s (tokens to whole KV pages)."""
    return int(-(-value // step) * step)
