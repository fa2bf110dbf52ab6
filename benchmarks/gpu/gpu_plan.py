"""What the GPU tools measure end to end, and how long each piece is expected to take (no torch here).

The models of the end-to-end validation set (configs copied into benchmarks/gpu/configs/, random weights, cut
to a few layers), the points measured on each (the full set of `measure_e2e.py`, and the shorter one of the
one-command run `run_gpu.sh all`), and the estimates the one-command run derives its budgets from.

The estimates are a roofline plus host costs, each constant with its source:
  FLOPS, BYTES_PER_S  the guess `mfu bench` orders its plan with (infersim.tabletools.bench.cases.estimated_seconds):
                      about half a Hopper GPU's bf16 peak and 75% of an H100's HBM bandwidth, so an H200 (788
                      TFLOP/s on an 8192^3 bf16 GEMM, 4.3 TB/s device-to-device, as measured on one) runs faster
  HOST_PER_KERNEL     24 us of host time per kernel of eager HF model code: PyTorch's gpt-fast blog, an eager
                      Llama-7B decode CPU-bound at 25.5 tok/s on an A100 (docs/eager-engines.md)
  KERNELS_PER_LAYER   ATen ops per decoder layer that each launch a kernel, counted on the CPU by
                      `count_eager_ops.py --device cpu` (torch 2.13, transformers 5.17): Llama 42, Mixtral 102,
                      Qwen3-MoE 120, DeepSeek-V3 164 (its MoE layer; taken for its dense layers too, an upper bound)
  STEP_HOST           generate()'s own host work per step, 1 ms: engines/huggingface.yaml's step_cpu estimate
  COMPILE_*           an assumption until a run's manifest says otherwise: Inductor compiling one decode shape of
                      a cut model and recording its CUDA graph, 15 s plus 3 s per decoder layer
  BUILD_SECONDS       an assumption: building one cut model from its config with random weights on the GPU
  PROCESS_START       an assumption: python3 importing torch and transformers and creating the CUDA context
Each run's manifest (run_all.py) records every estimate beside the time it took, so the next run can check them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parent / "configs"
#: models kept out of everything measured here: a separate check holds them back
HELD_OUT_MODELS = ("llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b")

FLOPS = 5e14
BYTES_PER_S = 2.5e12
HOST_PER_KERNEL = 24e-6
KERNELS_PER_LAYER = {"llama": 42, "mixtral": 102, "qwen3_moe": 120, "deepseek_v3": 164}
KERNELS_OUTSIDE_LAYERS = 22  # the same count: embedding, final norm, LM head, logits processing
STEP_HOST = 1e-3
COMPILED_STEP_HOST = 0.5e-3  # engines/huggingface-compiled.yaml's step_cpu estimate
COMPILE_BASE = 15.0
COMPILE_PER_LAYER = 3.0
BUILD_SECONDS = 5.0
PROCESS_START = 10.0
#: the estimates above are guesses: a budget gives each piece this much more than its estimate
SAFETY = 1.2


@dataclass(frozen=True)
class ModelPlan:
    """One model of the set: its config file, the layers kept, and the points measured on it."""

    name: str
    layers: int
    ttft: tuple[tuple[int, int], ...]  # (batch, prompt)
    decode: tuple[tuple[int, int], ...]  # (batch, prompt)
    compiled_decode: tuple[tuple[int, int], ...] = ()
    why: str = ""
    compiled_layers: int = 0  # layers kept in compiled mode (0: `layers`): Inductor's compile time grows with them
    compiled_ttft: tuple[tuple[int, int], ...] | None = None  # None: the eager ttft points

    def layers_for(self, mode: str) -> int:
        return self.compiled_layers if mode == "compiled" and self.compiled_layers else self.layers

    def points(self, mode: str) -> list[tuple[str, int, int]]:
        """(metric, batch, prompt) in the order they are measured."""
        ttft = self.ttft if mode == "eager" or self.compiled_ttft is None else self.compiled_ttft
        decode = self.decode if mode == "eager" else self.compiled_decode
        return [("ttft_ms", b, p) for b, p in ttft] + [("decode_step_ms", b, p) for b, p in decode]


_WHY = {
    "llama-3.1-70b": "dense GQA (64 query, 8 KV heads), 8 of 80 layers",
    "llama-2-7b": "dense MHA (32 heads), all 32 layers (8 in compiled mode, for the compile time)",
    "mixtral-8x7b": "MoE, 8 experts top-2, GQA, 8 of 32 layers",
    "qwen3-235b-a22b": "MoE, 128 experts top-8, GQA with q/k norms, 4 of 94 layers",
    "deepseek-v3": "MLA + MoE (256 experts top-8, a shared expert), 3 dense + 1 MoE of 61 layers",
}

# Layers kept: the fewest that leave each model's kinds of layer in place and fit 78 GiB with its
# caches at the largest point (bf16 weights; DeepSeek-V3 keeps its 3 dense layers and one MoE layer).
FULL_PLAN = (
    ModelPlan("llama-3.1-70b", 8, ((1, 128), (1, 1024), (1, 8192), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 1024), (8, 8192)), ((1, 1024), (32, 1024)),
              _WHY["llama-3.1-70b"]),
    ModelPlan("llama-2-7b", 32, ((1, 128), (1, 1024), (1, 4096), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 512)), ((1, 1024), (32, 1024)),
              _WHY["llama-2-7b"], compiled_layers=8),
    ModelPlan("mixtral-8x7b", 8, ((1, 128), (1, 1024), (1, 8192), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 1024)), ((1, 1024), (32, 1024)),
              _WHY["mixtral-8x7b"]),
    ModelPlan("qwen3-235b-a22b", 4, ((1, 128), (1, 1024), (1, 8192), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 1024)), ((1, 1024), (32, 1024)),
              _WHY["qwen3-235b-a22b"]),
    ModelPlan("deepseek-v3", 4, ((1, 128), (1, 1024), (1, 4096)),
              ((1, 1024), (16, 1024)), ((1, 1024),),
              _WHY["deepseek-v3"]),
)

# The one-command run: in order of value, each model's points from the host-bound end (batch 1: the launch
# loop HF's eager code is bound by) to the GPU-bound end (long prompts, large batches); compiled mode keeps
# two layers (each decode shape compiles once) and one prefill point (the prefill is not compiled).
ONE_RUN_PLAN = (
    ModelPlan("llama-3.1-70b", 8, ((1, 128), (1, 4096), (8, 1024)), ((1, 1024), (32, 1024)),
              ((1, 1024), (32, 1024)), _WHY["llama-3.1-70b"], compiled_layers=2, compiled_ttft=((1, 1024),)),
    ModelPlan("mixtral-8x7b", 8, ((1, 128), (1, 4096)), ((1, 1024), (32, 1024)),
              ((1, 1024), (32, 1024)), _WHY["mixtral-8x7b"], compiled_layers=2, compiled_ttft=((1, 1024),)),
    ModelPlan("qwen3-235b-a22b", 4, ((1, 128), (1, 4096)), ((1, 1024), (32, 1024)),
              (), _WHY["qwen3-235b-a22b"], compiled_ttft=()),
    ModelPlan("deepseek-v3", 4, ((1, 128), (1, 4096)), ((1, 1024), (16, 1024)),
              (), _WHY["deepseek-v3"], compiled_ttft=()),
    ModelPlan("llama-2-7b", 32, ((1, 128), (1, 4096)), ((1, 1024), (32, 1024)),
              (), _WHY["llama-2-7b"], compiled_ttft=()),
)
PLANS = {"full": FULL_PLAN, "one-run": ONE_RUN_PLAN}
#: the generate() lengths differenced for a decode step (N1, N2) and the timed samples per point; a smoke run's
NEW_TOKENS, REPEATS = (8, 40), 3
SMOKE_NEW_TOKENS, SMOKE_REPEATS = (2, 12), 1
#: the plans' points at tiny widths and lengths, for a CPU smoke run
SMOKE_POINTS = {"ttft": ((1, 16),), "decode": ((2, 16),), "compiled_decode": ((2, 16),)}


def smoke_plan(plan: ModelPlan) -> ModelPlan:
    return ModelPlan(plan.name, 2 if plan.name == "deepseek-v3" else 1, SMOKE_POINTS["ttft"], SMOKE_POINTS["decode"],
                     SMOKE_POINTS["compiled_decode"] if plan.compiled_decode else (), plan.why,
                     compiled_ttft=SMOKE_POINTS["ttft"][:1] if plan.compiled_ttft != () else ())


def load_config(name: str, layers: int, smoke: bool) -> dict[str, Any]:
    """The model's HF config, cut to `layers` layers, without its quantisation (random bf16 weights)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    for key in ("quantization_config", "auto_map", "_name_or_path"):
        config.pop(key, None)
    # transformers' DeepseekV3Config names these n_routed_experts and n_shared_experts; the copied config uses the
    # longer names, which it would ignore (and fall back to its defaults)
    for longer, hf_name in (("num_routed_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts")):
        if config.get("model_type") == "deepseek_v3" and longer in config:
            config.setdefault(hf_name, config.pop(longer))
    config["num_hidden_layers"] = layers
    config["torch_dtype"] = "bfloat16"
    if smoke:
        config.update(smoke_widths(config))
        if config.get("model_type") == "deepseek_v3":
            config["first_k_dense_replace"] = 1
    return config


def smoke_widths(config: dict[str, Any]) -> dict[str, Any]:
    """Tiny widths of the same architecture for a CPU smoke run (numbers mean nothing; code paths do)."""
    heads = 4
    kv = 4 if config.get("num_key_value_heads", heads) == config.get("num_attention_heads") else 2
    out: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": heads,
                           "num_key_value_heads": kv, "vocab_size": 512, "head_dim": 32,
                           "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1}
    if "moe_intermediate_size" in config:
        out["moe_intermediate_size"] = 64
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if key in config:
            out[key] = 8
    if "num_experts_per_tok" in config:
        out["num_experts_per_tok"] = 2
    if config.get("kv_lora_rank"):
        out.update(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                   head_dim=16, n_group=2, topk_group=1, num_key_value_heads=heads)
    return out


# ---------------------------------------------------------------------------------------------
# Estimates


@dataclass(frozen=True)
class Shape:
    """What one forward of a cut model costs: parameters and bytes per layer, from its HF config."""

    layers: int
    moe_layers: int
    attention_params: float  # per layer
    dense_mlp_params: float  # per dense layer
    expert_params: float  # one routed expert
    experts: int
    topk: int
    shared_params: float  # the shared experts of a MoE layer
    head_params: float  # the LM head
    kv_bytes_per_token: float  # per layer, bf16 (HF's DeepSeek-V3 caches the decompressed keys and values)
    attention_width: float  # heads x (qk + v) head dims
    kernels_per_layer: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        h, heads = config["hidden_size"], config["num_attention_heads"]
        d = config.get("head_dim") or h // heads
        if config.get("kv_lora_rank"):
            qk, v, rank, rope = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"], config["v_head_dim"],
                                 config["kv_lora_rank"], config["qk_rope_head_dim"])
            q_rank = config.get("q_lora_rank") or 0
            q_params = h * q_rank + q_rank * heads * qk if q_rank else h * heads * qk
            attention = q_params + h * (rank + rope) + rank * heads * (qk - rope + v) + heads * v * h
            kv_bytes, width = heads * (qk + v) * 2, heads * (qk + v)
        else:
            kv = config.get("num_key_value_heads", heads)
            attention, kv_bytes, width = 2 * h * heads * d + 2 * h * kv * d, 2 * kv * d * 2, 2 * heads * d
        experts = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts") or 0
        expert_width = config.get("moe_intermediate_size") or config.get("intermediate_size", 0)
        layers = config["num_hidden_layers"]
        dense_layers = min(config.get("first_k_dense_replace", 0), layers) if experts else layers
        return cls(layers, layers - dense_layers, attention, 3 * h * config.get("intermediate_size", 0),
                   3 * h * expert_width, experts, config.get("num_experts_per_tok", 0),
                   3 * h * expert_width * config.get("n_shared_experts", 0), h * config["vocab_size"], kv_bytes,
                   width, KERNELS_PER_LAYER.get(config.get("model_type", ""), max(KERNELS_PER_LAYER.values())))

    def weights_read(self, tokens: int) -> float:
        """Parameters one forward over `tokens` tokens reads: every dense weight, the experts its tokens reach."""
        reached = min(self.experts, tokens * self.topk) if self.experts else 0
        dense = self.layers * self.attention_params + (self.layers - self.moe_layers) * self.dense_mlp_params
        return dense + self.moe_layers * (reached * self.expert_params + self.shared_params) + self.head_params

    def flops(self, tokens: int, attended: float, logits_rows: int) -> float:
        """One forward over `tokens` tokens, each attending to `attended` tokens on average."""
        active = self.layers * self.attention_params + (self.layers - self.moe_layers) * self.dense_mlp_params \
            + self.moe_layers * (self.topk * self.expert_params + self.shared_params)
        return 2 * tokens * active + 2 * tokens * attended * self.attention_width * self.layers \
            + 2 * logits_rows * self.head_params


def forward_seconds(shape: Shape, batch: int, new_tokens: int, context: float, compiled: bool = False) -> float:
    """One forward: `new_tokens` per sequence over a cache of `context` tokens; the larger of its GPU time
    (a roofline) and its host time (kernels launched, eager; a graph replay, compiled)."""
    tokens = batch * new_tokens
    attended = context + new_tokens / 2
    flops = shape.flops(tokens, attended, batch)
    read = 2 * shape.weights_read(tokens) + batch * (context + new_tokens) * shape.kv_bytes_per_token * shape.layers
    gpu = max(flops / FLOPS, read / BYTES_PER_S)
    host = COMPILED_STEP_HOST if compiled else \
        (shape.layers * shape.kernels_per_layer + KERNELS_OUTSIDE_LAYERS) * HOST_PER_KERNEL + STEP_HOST
    return max(gpu, host)


def compile_seconds(layers: int) -> float:
    return COMPILE_BASE + COMPILE_PER_LAYER * layers


def point_seconds(config: dict[str, Any], mode: str, metric: str, batch: int, prompt: int,
                  new_tokens: tuple[int, int] = NEW_TOKENS, repeats: int = REPEATS) -> float:
    """Wall time of one point as measure_e2e.py measures it (its docstring): a TTFT point is a warm-up and
    `repeats` forwards; a decode point a warm-up and two timed generate() calls of N1 and of N2 tokens (each a
    prefill and its steps), in compiled mode after one generate() of N2 that compiles the step."""
    shape = Shape.of(config)
    prefill = forward_seconds(shape, batch, prompt, 0.0)
    if metric == "ttft_ms":
        return (1 + repeats) * prefill
    n1, n2 = new_tokens
    compiled = mode == "compiled"
    step = forward_seconds(shape, batch, 1, prompt + (n1 + n2) / 2, compiled)
    generate = 3 * (prefill + n1 * step) + 3 * (prefill + n2 * step)
    if compiled:
        generate += prefill + n2 * step + compile_seconds(shape.layers)
    return generate


def model_seconds(plan: ModelPlan, mode: str, smoke: bool = False, new_tokens: tuple[int, int] = NEW_TOKENS,
                  repeats: int = REPEATS) -> tuple[float, list[tuple[str, float]]]:
    """(building the model, [(point label, seconds)]) of one model in one mode."""
    config = load_config(plan.name, plan.layers_for(mode), smoke)
    points = [(point_label(plan.name, metric, batch, prompt),
               point_seconds(config, mode, metric, batch, prompt, new_tokens, repeats))
              for metric, batch, prompt in plan.points(mode)]
    return BUILD_SECONDS, points


def point_label(model: str, metric: str, batch: int, prompt: int) -> str:
    return f"{model} {'ttft' if metric == 'ttft_ms' else 'decode'} batch {batch} prompt {prompt}"


def trace_seconds(mode: str, layers: int, prompt: int, decode_batch: int, decode_steps: int,
                  config: dict[str, Any], compiled_prefill: bool = True) -> float:
    """One trace of record_traces.py: a model built, warm-ups (two rounds eager, three compiled, of the prefill
    and the decode steps) and the profiled round, with the profiler's export; compiled mode compiles the
    decode shape, and the prefill shape unless the prefill runs eagerly (`compiled_prefill` False)."""
    shape = Shape.of(dict(config, num_hidden_layers=layers))
    compiled = mode != "eager"
    prefill = forward_seconds(shape, 1, prompt, 0.0)
    step = forward_seconds(shape, decode_batch, 1, prompt + decode_steps / 2, compiled)
    rounds = (3 if compiled else 2) + 1
    export = 5.0  # the profiler's trace export and gzip, an assumption
    compiles = (2 if compiled_prefill else 1) if compiled else 0
    return BUILD_SECONDS + rounds * (2 * prefill + decode_steps * step) + export + compiles * compile_seconds(layers)
