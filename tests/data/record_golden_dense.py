"""Record the golden numbers of dense-attention cards (tests/data/golden_dense.json).

Run once before a change to the simulator core that must not move dense-attention results:
    python tests/data/record_golden_dense.py
tests/test_arch_dense_regression.py then asserts the same numbers (rel 1e-12).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from infersim.run.config import load_run_config  # noqa: E402
from infersim.run.simulate import simulate  # noqa: E402

# (config, overrides): the example config, the six published cases, and a few layout/precision variants
CASES: list[tuple[str, tuple[str, ...]]] = [
    ("configs/qwen3-30b.yaml", ()),
    *[(str(p.relative_to(REPO)), ()) for p in sorted((REPO / "benchmarks" / "published").glob("*.yaml"))],
    ("configs/qwen3-30b.yaml", ("deployment.overlap=two-batch", "deployment.moe_comm=deepep-normal")),
    ("configs/qwen3-30b.yaml", ("deployment.precision.gemm=fp8", "deployment.precision.kv_cache=fp8")),
    ("benchmarks/published/qwen3-8b-h20-decode.yaml", ("deployment.num_gpus=2", "deployment.attention.tp=2",
                                                       "deployment.ffn.tp=2")),
    ("benchmarks/published/deepseek-v3-h800-decode.yaml", ("deployment.precision.kv_cache=fp8",)),
]


def stage_numbers(stage) -> dict:
    return {
        "step_time_s": stage.step_time_s,
        "tgs": stage.tgs,
        "operations": [[op.group, op.name, op.time_s, op.flops, op.bytes] for op in stage.operations],
    }


def record() -> dict:
    out = {}
    for path, overrides in CASES:
        # at even expert load, as tests/test_arch_dense_regression.py compares them
        pinned = ("workload.decode_batch_per_gpu=100",) if path == "configs/qwen3-30b.yaml" else ()  # see RECORDED_WITH
        result = simulate(load_run_config(str(REPO / path), [*overrides, *pinned, "deployment.moe.load_balance=ideal",
                                                             "deployment.moe.redundant_experts=0"]))
        mem = result.memory
        key = path + ("" if not overrides else " " + " ".join(overrides))
        out[key] = {
            "config": path,
            "overrides": list(overrides),
            "prefill": stage_numbers(result.prefill),
            "decode": stage_numbers(result.decode),
            "memory": {
                "weights_bytes": mem.weights_bytes,
                "kv_bytes_per_token": mem.kv_bytes_per_token,
                "kv_bytes_per_token_per_gpu": mem.kv_bytes_per_token_per_gpu,
                "kv_capacity_bytes": mem.kv_capacity_bytes,
                "max_batch_per_gpu": mem.max_batch_per_gpu,
            },
        }
    return out


if __name__ == "__main__":
    target = Path(__file__).resolve().parent / "golden_dense.json"
    target.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {target}")
