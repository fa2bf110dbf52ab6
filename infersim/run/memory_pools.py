"""The pools an engine keeps beside its KV cache for some models, as records of one run's memory
(infersim.run.memory builds them): a hybrid sliding-window pool and a pool of recurrent-state
slots. Kept apart so that a run whose model and engine keep neither does not create them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPool:
    """An engine's hybrid sliding-window pool (engine card memory.sliding_window_pool_ratio), for a
    model with full-attention and sliding-window layers: the pool is sized in tokens of the
    full-attention layers, each allotted `ratio` tokens of the sliding-window layers' KV beside it,
    used or not; a request holds its context in the first and the tokens of its window in the second."""

    ratio: float
    bytes_per_token_per_gpu: float  # the sliding-window layers' KV of one token on one GPU
    request_tokens: int  # tokens of a request in the window at its end



@dataclass(frozen=True)
class StatePool:
    """The engine's pool of recurrent-state slots (engine card memory.recurrent_state_pool) for a
    hybrid linear-attention or Mamba model: every GPU of a scheduler's TP group holds its share of
    every slot; the pool is set aside from the KV space, and a running request holds its states there,
    not in the KV pool."""

    slots: int  # slots a scheduler can hand out
    slot_bytes_per_gpu: float  # one request's recurrent and conv states on one GPU
    slots_per_request: int
    held_bytes_per_gpu: float  # what the pool takes of one GPU's KV space

    @property
    def requests(self) -> int:
        """Running requests one scheduler holds states for."""
        return self.slots // self.slots_per_request
