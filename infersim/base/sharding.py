"""The one place where sizes are divided across GPUs: an indivisible layout is an error, never a floor."""

from __future__ import annotations

from infersim.base.errors import LayoutError


def shard(total: int, parts: int, what: str, by: str) -> int:
    """total / parts, exactly. `what` names the quantity, `by` the parallel dimension."""
    if parts <= 0:
        raise LayoutError(f"{by} must be positive (got {parts})")
    if total % parts:
        raise LayoutError(f"{what} ({total}) is not divisible by {by} ({parts})")
    return total // parts


def heads_per_rank(num_kv_heads: int, tp: int, what: str = "num_key_value_heads") -> int:
    """KV heads each TP rank holds: split when tp divides them, replicated (one per rank) when
    there are fewer KV heads than ranks and they divide tp (as serving engines do)."""
    if tp <= num_kv_heads:
        return shard(num_kv_heads, tp, what, "attention.tp")
    if tp % num_kv_heads:
        raise LayoutError(f"attention.tp ({tp}) is larger than {what} ({num_kv_heads}) and not a multiple of it, "
                          "so KV heads cannot be replicated evenly")
    return 1
