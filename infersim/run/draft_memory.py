"""What a speculative drafter adds to a GPU's memory: a record of its own, so that a run without a
drafter does not define it (infersim.run.speculative makes it, infersim.run.memory counts it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftMemory:
    """What a speculative drafter adds on every GPU (beside the model's, infersim.run.memory.memory_budget)."""

    weights_bytes: float  # per GPU
    kv_bytes_per_token: float  # one token's cache over the drafter's layers (unsharded)
    kv_bytes_per_token_per_gpu: float
    bounded_bytes_per_request: float = 0.0  # unsharded
    bounded_bytes_per_request_per_gpu: float = 0.0
