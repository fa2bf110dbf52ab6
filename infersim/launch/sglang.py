"""A simulated deployment in SGLang's flags (`python -m sglang.launch_server`).

Layout (python/sglang/srt/server_args.py): --tp is every GPU of a pipeline stage; with
--enable-dp-attention attention runs on --dp ranks of tp/dp GPUs each and the MoE layers over all
--tp GPUs, experts spread over --ep of them (expert TP = tp / ep); without it --dp starts model
replicas behind SGLang's own load balancer. Server-wide counts: --chunked-prefill-size and
--max-running-requests are divided by --dp under DP attention, so they are the per-rank figure
times the DP size. Across nodes every node runs the same command with its --node-rank. PD
disaggregation: --disaggregation-mode prefill / decode, and sglang-router in front.
"""

from __future__ import annotations

from infersim.cards.deployment import Deployment
from infersim.cards.model import ModelCard
from infersim.launch.assumed import Assumed, Layout, layout_from, layout_of
from infersim.launch.common import (
    add_running_cap,
    HEAD,
    check_common,
    checkpoint,
    context_limit,
    kv_cache_format,
    node_hosts,
    refuse,
    speculative,
)
from infersim.launch.common import where as where_text
from infersim.cards.engine_parser import ParserData
from infersim.launch.plan import Arguments, PlanParts

#: a free port on node 0 for the distributed initialisation (any free port serves)
DIST_INIT_PORT = 5000


def parallel_sizes(layout: Layout, data: ParserData) -> tuple[int, int, bool, int]:
    """(--tp, --dp, --enable-dp-attention, --ep) of the layout."""
    form = layout.form
    if form == "other":
        raise refuse(data, layout.describe(), "SGLang runs the FFN over the whole TP group (DP attention) or over "
                                              "each replica's own TP group")
    if form == "dp-attention":
        return layout.stage, layout.attn_dp, True, layout.ffn_ep
    return layout.attn_tp, layout.attn_dp, False, layout.ffn_ep


def check_layout(dep: Deployment, model: ModelCard, data: ParserData) -> tuple[int, int, bool, int]:
    """(--tp, --dp, --enable-dp-attention, --ep) of a completed deployment, or the refusal of what in its
    layout or MoE path SGLang cannot express (the rule a layout search keeps to as well)."""
    sizes = parallel_sizes(layout_from(dep, model), data)
    if model.is_moe and dep.moe_comm == "all-to-all":
        # python/sglang/srt/server_args.py --moe-a2a-backend: none (tokens gathered or replicated, outputs
        # reduced) or deepep in 0.5.2; main (001067f) adds mooncake, nixl, mori, pplx, flashinfer, ...
        # (MOE_A2A_BACKEND_CHOICES), none of them NCCL's all-to-all
        raise refuse(data, "moe_comm all-to-all", "SGLang has no NCCL all-to-all MoE path: tokens are gathered "
                                                  "(--moe-a2a-backend none) or sent with DeepEP")
    return sizes


def _moe(a: Assumed, args: Arguments, layout: Layout, dp_attention: bool) -> None:
    dep = a.config.deployment
    if not layout.is_moe:
        return
    comm = dep.moe_comm
    if comm.startswith("deepep"):
        args.add("--moe-a2a-backend", "deepep", "MoE dispatch")
        args.add("--deepep-mode", "normal" if comm == "deepep-normal" else "low_latency", "DeepEP mode")
    else:
        args.realise("--moe-a2a-backend", "none", "MoE dispatch")
    if dp_attention:
        per_rank = dep.lm_head == "per-rank" and not a.config.model.tie_word_embeddings
        args.realise("--enable-dp-lm-head", per_rank, "LM head per DP rank")
    if dep.moe.load_balance == "eplb":
        args.add("--enable-eplb", True, "expert-parallel load balancer")
        args.add("--ep-num-redundant-experts", dep.moe.redundant_experts, "redundant expert slots")
    else:
        args.realise("--enable-eplb", False, "expert-parallel load balancer")


def _graphs(a: Assumed, args: Arguments, dp: int) -> None:
    if not a.engine.overheads.decode_cuda_graph:
        args.add("--disable-cuda-graph", True, "CUDA graphs off")
        return
    args.realise("--disable-cuda-graph", False, "CUDA graphs off")
    args.add("--cuda-graph-max-bs", a.graph_sizes[-1], "largest CUDA-graph batch")
    args.add("--cuda-graph-bs", list(a.graph_sizes), "CUDA-graph batch sizes")


def _scheduler(a: Assumed, args: Arguments, dp_attention: bool, dp: int, parts: PlanParts) -> None:
    engine = a.engine
    ranks = dp if dp_attention else 1
    if a.token_budget and a.chunked:
        args.add("--chunked-prefill-size", a.token_budget * ranks, "token budget per step (x DP ranks)")
    else:
        args.add("--chunked-prefill-size", -1, "token budget per step (x DP ranks)")
        if a.token_budget:
            parts.note(f"the simulation capped a step at {a.token_budget} tokens without chunking; SGLang bounds an "
                       "unchunked prefill step by --max-prefill-tokens, not set here")
    if a.running_cap:
        add_running_cap(a, args, a.running_cap * ranks, "running requests (x DP ranks)")
    else:
        parts.note("running requests: SGLang's own cap from its KV pool and the context length, as by default")
    args.add("--mem-fraction-static", round(a.static_fraction, 3), "GPU memory share for weights and KV")
    args.realise("--page-size", engine.scheduler.page_size, "KV page size")
    args.realise("--disable-radix-cache", not a.prefix_cache, "prefix cache off")
    method, _k, _draft = speculative(a, args.data)
    overlap = engine.overheads.overlap_scheduler and (not method or engine.overheads.overlap_with_speculative)
    args.realise("--disable-overlap-schedule", not overlap, "overlap scheduler off")
    args.realise("--enable-mixed-chunk", a.mixed, "mixed prefill and decode steps")


def _speculative(a: Assumed, args: Arguments) -> None:
    method, k, draft = speculative(a, args.data)
    if not method:
        return
    args.add("--speculative-algorithm", "NEXTN" if method == "mtp" else "STANDALONE",
             "speculative decoding")
    if draft:
        args.add("--speculative-draft-model-path", draft)
    args.add("--speculative-num-steps", k, "lookahead")
    args.add("--speculative-eagle-topk", 1, "draft chain width")
    args.add("--speculative-num-draft-tokens", k + 1, "tokens verified per step")


def _server_args(a: Assumed, data: ParserData, parts: PlanParts, port: int) -> tuple[Arguments, Layout]:
    check_common(a, data)
    args = Arguments(data.server, data, a.role)
    checkpoint(a, args, parts, online_fp8=True)
    layout = layout_of(a.config)
    tp, dp, dp_attention, ep = check_layout(a.config.deployment, a.config.model, data)
    args.realise("--tp", tp, "TP size (attention TP x DP)")
    if dp_attention:
        args.add("--enable-dp-attention", True, "DP attention")
    args.realise("--dp", dp, "DP size")
    if layout.is_moe:
        args.realise("--ep", ep, "EP size")
    args.realise("--pp-size", layout.pp, "pipeline stages")
    _moe(a, args, layout, dp_attention)
    args.realise("--enable-two-batch-overlap", a.config.deployment.overlap == "two-batch", "two-batch overlap")
    args.realise("--kv-cache-dtype", kv_cache_format(a, data, {"fp8": "fp8_e4m3"}), "KV-cache format")
    _scheduler(a, args, dp_attention, dp, parts)
    context_limit(a, args, parts, "--context-length")
    _graphs(a, args, dp)
    _speculative(a, args)
    if a.role != "server":
        args.add("--disaggregation-mode", a.role, "PD side")
        args.realise("--disaggregation-transfer-backend", "mooncake", "KV transfer engine (PD)")
    if port:
        args.realise("--port", port, "port")
    return args, layout


def spell(a: Assumed, data: ParserData, parts: PlanParts, port: int = 0) -> None:
    args, _layout = _server_args(a, data, parts, port)
    nodes = node_hosts(a)
    if len(nodes) == 1:
        parts.take(args, where_text(a, a.role))
        return
    args.add("--nnodes", len(nodes))
    args.add("--dist-init-addr", f"{HEAD}:{DIST_INIT_PORT}")
    followers = [args.copy() for _ in nodes[1:]]
    args.add("--node-rank", 0)
    parts.take(args, where_text(a, a.role, nodes[0]))
    for rank, (node, node_args) in enumerate(zip(nodes[1:], followers), start=1):
        node_args.add("--node-rank", rank)
        parts.take(node_args, where_text(a, a.role, node), record=False)
    parts.note(f"HEAD_IP: node 0's address; port {DIST_INIT_PORT} of --dist-init-addr is any free port there")


def spell_router(prefill_urls: list[str], decode_urls: list[str], data: ParserData, parts: PlanParts, port: int) -> None:
    if data.router is None:
        raise refuse(data, "PD disaggregation", "no router is known in its parser data")
    bootstrap = data.server.find("--disaggregation-bootstrap-port")
    args = Arguments(data.router, data, "router")
    args.add("--pd-disaggregation", True, "PD routing")
    args.add("--prefill", [[url, str(bootstrap.default)] if bootstrap else [url] for url in prefill_urls])
    args.add("--decode", [[url] for url in decode_urls])
    args.add("--host", "0.0.0.0")
    args.add("--port", port)
    parts.take(args, "any host that reaches the servers")
