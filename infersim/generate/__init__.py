"""Whole-request generation of a static batch, the way DeepSpeed ZeRO-Inference / FlexGen benchmark it.

One prefill of batch x prompt_len tokens, then gen_len - 1 decode steps whose KV length grows by
one token per step, timed step by step. Weights and/or the KV cache may live in host memory (or
weights on NVMe) and be streamed to the GPU every forward pass over PCIe, one layer ahead of the
compute (prefetch). Reports the benchmark's metric set: model size, KV-cache size, hidden-state
size, peak GPU memory, and latency/throughput of prefill, decode and the whole generation.

    spec      - the `generate:` section of a run YAML (and its CLI flags), validated
    offload   - bytes that cross PCIe per layer, and the prefetch schedule of one forward pass
    simulate  - the generation itself: GenerationResult
    report    - text, the benchmark's four-line log, JSON
    cli       - `python -m infersim generate ...`
"""

from infersim.generate.simulate import DoesNotFit, GenerationResult, simulate_generation
from infersim.generate.spec import GenerateSpec, load_generate_config

__all__ = ["DoesNotFit", "GenerateSpec", "GenerationResult", "load_generate_config", "simulate_generation"]
