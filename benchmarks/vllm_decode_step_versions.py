"""One vLLM decode step under each bundled vLLM engine card: what the newer releases' mechanisms change.

For Llama-3.1-8B (TP1) and Llama-3.1-70B (TP4) on H100 at scheduler batches of 32, 64 and 128 and a
1,600-token decode context, the step time and the parts the engine cards move: the per-step overhead
(vLLM 0.11 card: 0.5 ms estimated outside the graph, and the scheduler's CPU time exposed by its
synchronous scheduling; 0.15 and later: the kernels each step runs outside the captured forward,
counted in the model runner, at the hardware card's per-kernel time, the CPU hidden by async scheduling)
and the elementwise kernels (0.33 at TP > 1 on Hopper folds each residual add + RMSNorm into the
FlashInfer all-reduce kernel before it, up to 2 MiB all-reduced per step at TP4). Kernel tables are
the bundled ones the run picks, the same for every card, so only the cards' mechanisms differ.

Run: python benchmarks/vllm_decode_step_versions.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infersim.cards import categories as cat
from infersim.run.config import load_run_config
from infersim.run.flags import RunFlags
from infersim.run.simulate import simulate

CASES = (("llama-3.1-8b", 1), ("llama-3.1-70b", 4))
BATCHES = (32, 64, 128)  # requests of one scheduler (the TP group)
ISL, OSL = 1500, 200  # decode context averages ISL + OSL / 2 = 1,600 tokens
ENGINES = ("vllm@0.11", "vllm@0.15", "vllm@0.33")


def decode_parts(model: str, tp: int, batch: int, engine: str) -> tuple[float, float, float]:
    """(step ms, scheduler overhead ms, elementwise ms) of one decode step."""
    flags = RunFlags(model=model, hardware="h100", engine=engine, tp=tp, isl=ISL, osl=OSL, batch_per_gpu=batch // tp)
    decode = simulate(load_run_config(None, flags=flags)).decode
    modules = decode.module_times()
    return decode.step_time_s * 1e3, modules.get(cat.OVERHEAD, 0.0) * 1e3, modules.get(cat.ELEMENTWISE, 0.0) * 1e3


def main() -> None:
    print(f"decode step on h100, context {ISL + OSL // 2} tokens (ms: step / overhead / elementwise)")
    print(f"{'model':<16}{'TP':>3}{'batch':>7}" + "".join(f"{e:>26}" for e in ENGINES) + f"{'0.15 vs 0.11':>14}"
          + f"{'0.33 vs 0.11':>14}")
    for model, tp in CASES:
        for batch in BATCHES:
            parts = [decode_parts(model, tp, batch, engine) for engine in ENGINES]
            cells = "".join(f"{step:>12.2f} /{over:>5.2f} /{elem:>5.2f}" for step, over, elem in parts)
            first = parts[0][0]
            print(f"{model:<16}{tp:>3}{batch:>7}{cells}{parts[1][0] / first - 1:>+13.1%}{parts[2][0] / first - 1:>+14.1%}")


if __name__ == "__main__":
    main()
