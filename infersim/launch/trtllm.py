"""A simulated deployment in TensorRT-LLM's flags (`trtllm-serve` and its LLM API options file).

Layout: --tp_size is every GPU of a pipeline stage and the MoE layers' experts spread over --ep_size
of them (expert TP = tp / ep); enable_attention_dp makes each of those ranks its own attention
replica (attention TP 1), so DP attention with attention TP above 1 is refused, as are replicas
inside one server. Batch limits (--max_batch_size, --max_num_tokens) count one rank's executor.
The MoE communication (all-to-all or gathered) is TensorRT-LLM's own choice by the layout, which
the engine card's rule reproduces. Multi-node (MPI launch) and PD disaggregation (trtllm-serve
disaggregated) are not in the parser data and are refused.
"""

from __future__ import annotations

from infersim.cards.deployment import Deployment
from infersim.cards.model import ModelCard
from infersim.launch.assumed import Assumed, Layout, layout_from, layout_of
from infersim.launch.common import (
    add_running_cap,
    check_common,
    checkpoint,
    context_limit,
    kv_cache_format,
    refuse,
    speculative,
)
from infersim.launch.common import where as where_text
from infersim.cards.engine_parser import ParserData
from infersim.launch.plan import Arguments, PlanParts

OPTIONS_FILE = "extra-llm-api-config.yml"


def parallel_sizes(layout: Layout, data: ParserData) -> tuple[int, bool, int]:
    """(--tp_size, enable_attention_dp, --ep_size) of the layout."""
    text = layout.describe()
    form = layout.form
    if form == "tp":
        return layout.attn_tp, False, layout.ffn_ep
    if form == "dp-attention" and layout.attn_tp == 1:
        return layout.stage, True, layout.ffn_ep
    if form == "dp-attention":
        raise refuse(data, text, "TensorRT-LLM's attention DP makes every rank its own attention replica "
                                 "(attention TP 1)")
    if form == "replicas":
        raise refuse(data, text, "data-parallel copies of the model are separate TensorRT-LLM servers "
                                 "(serve --replicas)")
    raise refuse(data, text, "TensorRT-LLM runs the FFN over the whole --tp_size group")


def check_layout(dep: Deployment, model: ModelCard, data: ParserData) -> tuple[int, bool, int]:
    """(--tp_size, enable_attention_dp, --ep_size) of a completed deployment, or the refusal of what in its
    layout, node span, MoE path or LM head TensorRT-LLM cannot express (the rule a layout search keeps to)."""
    sizes = parallel_sizes(layout_from(dep, model), data)
    if dep.num_nodes > 1:
        raise refuse(data, f"{dep.num_nodes} nodes", "a multi-node TensorRT-LLM server starts under MPI "
                                                     "(trtllm-llmapi-launch), which InferSim does not emit")
    if model.is_moe and dep.moe_comm.startswith("deepep"):
        raise refuse(data, f"moe_comm {dep.moe_comm}", "TensorRT-LLM has no DeepEP path")
    if dep.attention.dp > 1 and dep.lm_head == "gathered" and not model.tie_word_embeddings:
        raise refuse(data, "lm_head gathered", "TensorRT-LLM computes each attention-DP rank's logits on its own")
    return sizes


def _unsupported(a: Assumed, data: ParserData) -> None:
    dep = a.config.deployment
    if a.role != "server":
        raise refuse(data, "PD disaggregation", "its disaggregated serving (trtllm-serve disaggregated) is not in "
                                                "InferSim's parser data")
    if dep.overlap == "two-batch":
        raise refuse(data, "two-batch overlap", "no such option is in InferSim's parser data of it")
    if a.config.model.is_moe and dep.moe.load_balance == "eplb":
        raise refuse(data, "EPLB", "its expert load balancer is not in InferSim's parser data")
    if speculative(a, data)[0]:
        raise refuse(data, "speculative decoding", "its speculative_config is not in InferSim's parser data")
    if not a.engine.overheads.decode_cuda_graph:
        raise refuse(data, "decode without CUDA graphs", "switching them off is not in InferSim's parser data")


def _scheduler(a: Assumed, args: Arguments, parts: PlanParts) -> None:
    engine = a.engine
    if a.running_cap:
        add_running_cap(a, args, a.running_cap, "running requests per rank")
    else:
        parts.note("running requests: TensorRT-LLM's default cap (the simulation assumed none)")
    if a.token_budget:
        args.add("--max_num_tokens", a.token_budget, "token budget per step per rank")
    else:
        parts.note("token budget: TensorRT-LLM's default max_num_tokens (the simulation took whole prompts)")
    args.realise("enable_chunked_prefill", a.chunked, "chunked prefill")
    args.add("--kv_cache_free_gpu_memory_fraction", engine.memory.kv_fraction_of_free, "KV share of free memory")
    args.realise("kv_cache_config.tokens_per_block", engine.scheduler.page_size, "KV block size")
    args.realise("kv_cache_config.enable_block_reuse", a.prefix_cache, "prefix (block) reuse")
    args.realise("disable_overlap_scheduler", not engine.overheads.overlap_scheduler, "overlap scheduler off")
    args.add("cuda_graph_config.batch_sizes", list(a.graph_sizes), "CUDA-graph batch sizes")
    padding = bool(engine.overheads.cuda_graph_batch_sizes)
    args.realise("cuda_graph_config.enable_padding", padding, "CUDA-graph padding")


def spell(a: Assumed, data: ParserData, parts: PlanParts, port: int = 0) -> None:
    tp, attention_dp, ep = check_layout(a.config.deployment, a.config.model, data)
    _unsupported(a, data)
    check_common(a, data)
    args = Arguments(data.server, data, a.role)
    checkpoint(a, args, parts, online_fp8=False)
    layout = layout_of(a.config)
    args.realise("--backend", "pytorch", "PyTorch backend")
    args.realise("--tp_size", tp, "TP size")
    args.realise("--pp_size", layout.pp, "pipeline stages")
    if layout.is_moe:
        args.add("--ep_size", ep, "EP size")
        parts.note(f"MoE communication: TensorRT-LLM's own choice for this layout ({a.config.deployment.moe_comm}, "
                   f"as engine card {a.engine.name}'s rule derives it)")
    args.realise("enable_attention_dp", attention_dp, "attention DP")
    args.realise("kv_cache_config.dtype", kv_cache_format(a, data, {"fp8": "fp8"}), "KV-cache format")
    _scheduler(a, args, parts)
    context_limit(a, args, parts, "--max_seq_len")
    if port:
        args.realise("--port", port, "port")
    parts.take(args, where_text(a, a.role), OPTIONS_FILE)
