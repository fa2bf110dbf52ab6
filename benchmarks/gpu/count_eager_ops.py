"""Kernels HF transformers launches per layer and per step, counted, beside what the simulator's plan emits.

    python3 benchmarks/gpu/count_eager_ops.py                 # on a GPU: CUDA kernels the profiler records
    python3 benchmarks/gpu/count_eager_ops.py --device cpu    # here: ATen ops that would each launch one
    python3 benchmarks/gpu/count_eager_ops.py --compiled      # also the compiled decode forward (torch.compile)

For each model of the GPU validation set, a tiny-width model of the same architecture (its config from
benchmarks/gpu/configs/, widths shrunk as measure_e2e.py --smoke does) is run at two layer counts; the
difference is the kernels of one layer, the rest the step's own. Beside them: the kernels one layer of the
same config launches in the simulator's plan (engine huggingface, or huggingface-compiled with --compiled),
the count the engine's launch cost is charged on. On the CPU the count is the leaf ATen ops that do work
(infersim.tabletools.bench.torch_backend.count_cpu_kernel_ops); a CPU reduction is several ATen calls where CUDA
runs one kernel, so small differences there are the CPU's. Results go to stdout and, with --out, JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure_e2e import MODELS, load_config  # noqa: E402

from infersim.tabletools.bench.torch_backend import count_cpu_kernel_ops  # noqa: E402


def count(torch: Any, model: Any, device: str, stage: str, compiled: bool) -> tuple[int, collections.Counter]:
    """Kernels of one prefill (16 tokens x 2) or decode forward, and their names."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache, StaticCache

    ids = torch.randint(0, 200, (2, 16), device=device)
    cache = StaticCache(config=model.config, max_cache_len=64) if compiled else DynamicCache(config=model.config)
    forward = model.forward
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1:].argmax(-1)
        position = torch.full((2, 1), 16, device=device, dtype=torch.long)
        if compiled:
            forward = torch.compile(model.forward, mode="reduce-overhead" if device.startswith("cuda") else None)
            for _ in range(3):  # compile, record the graph
                forward(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1, position_ids=position)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with profile(activities=activities) as prof:
            if stage == "prefill" and not compiled:
                model(input_ids=ids, past_key_values=DynamicCache(config=model.config), use_cache=True,
                      logits_to_keep=1)
            else:
                forward(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1,
                        position_ids=position)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    events = prof.events()
    if device.startswith("cuda"):
        kernels = [e.name for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")
                   and not e.name.startswith(("Memcpy", "Memset"))]
        return len(kernels), collections.Counter(kernels)
    return count_cpu_kernel_ops(events), collections.Counter()


def simulated(config: dict[str, Any], engine: str, stage: str) -> int:
    """Kernels all layers launch in the simulator's plan of the same (cut, tiny) config."""
    from infersim.cards.hf_import import card_fields_from_hf
    from infersim.run.config import config_from_mapping
    from infersim.engine.stage import operation_kernels
    from infersim.modules.step import build_stage_plan

    card = card_fields_from_hf(config, "count_eager_ops", "counted")
    run = {"model": card, "hardware": "h100-sxm", "engine": engine, "deployment": {"num_gpus": 1},
           "workload": {"isl": 16, "osl": 2, "decode_batch_per_gpu": 2, "prefill_tokens_per_gpu": 32},
           "mfu_tables": "none"}
    rc = config_from_mapping(run, "count_eager_ops")
    tokens = 32 if stage == "prefill" else 2
    plan = build_stage_plan(stage, rc.model, rc.deployment, rc.workload, tokens, 0)
    return sum(g.layers * sum(operation_kernels(op) for op in g.operations) for g in plan.groups)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compiled", action="store_true", help="also count the compiled decode forward")
    parser.add_argument("--out", type=Path, default=None, help="write the counts as JSON here")
    parser.add_argument("--models", default="", help="comma-separated names (default: all five)")
    args = parser.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    rows = []
    wanted = [m for m in args.models.split(",") if m] or [p.name for p in MODELS]
    for plan in MODELS:
        if plan.name not in wanted:
            continue
        base = load_config(plan.name, 1, smoke=True)
        low, high = (2, 3) if base.get("kv_lora_rank") else (1, 2)
        if base.get("kv_lora_rank"):
            base["first_k_dense_replace"] = 1  # the dense layer counted at both counts: the difference is a MoE layer
        modes = [("eager", False)] + ([("compiled", True)] if args.compiled else [])
        for mode, compiled in modes:
            for stage in (("prefill", "decode") if not compiled else ("decode",)):
                counts = {}
                for layers in (low, high):
                    config = dict(base, num_hidden_layers=layers)
                    fields = dict(config)
                    model_type = fields.pop("model_type")
                    with torch.device(args.device):
                        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields),
                                                                 dtype=torch.bfloat16, attn_implementation="sdpa")
                    counts[layers] = count(torch, model.eval(), args.device, stage, compiled)
                    if compiled:
                        torch._dynamo.reset()
                per_layer = counts[high][0] - counts[low][0]
                engine = "huggingface-compiled" if compiled else "huggingface"
                sim = (simulated(dict(base, num_hidden_layers=high), engine, stage)
                       - simulated(dict(base, num_hidden_layers=low), engine, stage)) // (high - low)
                names = counts[high][1] - counts[low][1]
                rows.append({"model": plan.name, "mode": mode, "stage": stage, "measured_per_layer": per_layer,
                             "measured_per_step_outside_layers": counts[low][0] - low * per_layer,
                             "simulated_per_layer": sim, "kernels": dict(names.most_common(40))})
                print(f"{plan.name:18s} {mode:9s} {stage:8s} per layer: measured {per_layer:4d}, simulated {sim:4d}; "
                      f"outside the layers {counts[low][0] - low * per_layer}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"kernel-counts-{args.device.split(':')[0]}{'-compiled' if args.compiled else ''}.json"
        path.write_text(json.dumps({"device": args.device, "torch": str(torch.__version__), "rows": rows}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
