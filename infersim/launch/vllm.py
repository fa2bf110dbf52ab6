"""A simulated deployment in vLLM's flags (`vllm serve`).

Layout (vllm/config/parallel.py): --tensor-parallel-size is the attention TP group, one per
data-parallel rank; --data-parallel-size ranks of an MoE model share its experts, either expert
parallel over all TP x DP GPUs (--enable-expert-parallel, EP = TP x DP, expert TP 1) or tensor
parallel over them; a dense model's DP ranks are replicas. Any other FFN split is refused. The
scheduler's flags count one engine core (one DP rank). Across nodes: DP ranks by node
(--data-parallel-size-local, --data-parallel-address, --headless on the other nodes), or a TP/PP
group spanning nodes where the version has --nnodes (vLLM 0.15 and later; 0.11 needs a Ray cluster,
which is refused). PD disaggregation: each side carries a NIXL --kv-transfer-config and vllm-router
sends requests through both.
"""

from __future__ import annotations

from infersim.cards.deployment import Deployment, server_tp
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
from infersim.cards.engine_parser import ParserData, SizeRange
from infersim.launch.plan import Arguments, PlanParts

MOE_BACKENDS = {"all-gather": "allgather_reducescatter", "deepep-normal": "deepep_high_throughput",
                "deepep-low-latency": "deepep_low_latency"}
PD_KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def parallel_sizes(layout: Layout, data: ParserData) -> tuple[int, int, bool]:
    """(--tensor-parallel-size, --data-parallel-size, --enable-expert-parallel) of the layout."""
    text = layout.describe()
    tp, dp = layout.attn_tp, layout.attn_dp
    form = layout.form
    if form == "other":
        raise refuse(data, text, "vLLM splits the FFN over one attention TP group, or an MoE model's experts over "
                                 "all TP x DP GPUs")
    if form == "replicas":
        if layout.is_moe:
            raise refuse(data, text, "vLLM's data-parallel ranks of an MoE model share its experts; copies with "
                                     "experts of their own are separate servers (serve --replicas)")
        return tp, dp, False
    if form == "dp-attention" and not layout.is_moe:
        raise refuse(data, text, "vLLM's data-parallel ranks of a dense model are replicas; a dense FFN shared by "
                                 "data-parallel attention ranks has no vLLM spelling")
    group = layout.stage
    if not layout.is_moe or layout.ffn_ep == 1:
        return tp, dp, False
    if layout.ffn_ep == group:
        return tp, dp, True
    raise refuse(data, text, "vLLM's expert parallelism spans all TP x DP GPUs with expert TP 1 "
                             "(--enable-expert-parallel): any other expert TP x EP split has no vLLM spelling")


def moe_backend(dep: Deployment, model: ModelCard, dp: int, ep: bool, data: ParserData) -> str:
    """vLLM's all2all backend for the deployment's MoE path ('' where it dispatches no tokens between
    ranks), or the refusal of a path it has no backend for."""
    if not model.is_moe:
        return ""
    comm = dep.moe_comm
    if not (ep and dp > 1):  # vLLM dispatches tokens between ranks only across DP ranks with EP
        if comm.startswith("deepep"):
            raise refuse(data, f"moe_comm {comm}", "vLLM dispatches with DeepEP only between data-parallel ranks with "
                                                   "expert parallelism (--data-parallel-size > 1)")
        return ""
    if comm not in MOE_BACKENDS:
        raise refuse(data, f"moe_comm {comm}", "vLLM has no NCCL all-to-all MoE path (its backends: "
                                               + ", ".join(sorted(MOE_BACKENDS.values())) + ")")
    if dep.lm_head == "gathered" and not model.tie_word_embeddings:
        raise refuse(data, "lm_head gathered", "vLLM computes each data-parallel rank's logits on its own (per-rank)")
    return MOE_BACKENDS[comm]


def node_split(layout: Layout, dp: int, data: ParserData) -> int:
    """How a server spans its nodes: 0 on one node or with a TP x PP group spanning them (--nnodes), else
    the data-parallel ranks each node runs (--data-parallel-size-local); refused where neither holds."""
    nodes = layout.num_nodes
    if nodes == 1:
        return 0
    per_node = layout.gpus_per_node
    group = layout.attn_tp * layout.pp
    local = per_node // group if per_node % group == 0 else 0
    if dp > 1 and local and dp == local * nodes:
        return local
    if dp == 1 and data.server.has("--nnodes"):
        return 0
    raise refuse(data, layout.describe(), f"vLLM {data.version} spans nodes with whole data-parallel ranks on "
                                          "each node, or (0.15 and later) with one TP x PP group over them "
                                          "(--nnodes); a Ray cluster is not emitted")


def check_layout(dep: Deployment, model: ModelCard, data: ParserData) -> tuple[int, int, bool]:
    """(--tensor-parallel-size, --data-parallel-size, --enable-expert-parallel) of a completed deployment,
    or the refusal of what in its layout, MoE path or node span vLLM cannot express (the rule a layout
    search keeps to as well)."""
    layout = layout_from(dep, model)
    tp, dp, ep = parallel_sizes(layout, data)
    moe_backend(dep, model, dp, ep, data)
    node_split(layout, dp, data)
    return tp, dp, ep


def _moe(a: Assumed, args: Arguments, dp: int, ep: bool) -> None:
    dep = a.config.deployment
    backend = moe_backend(dep, a.config.model, dp, ep, args.data)
    if not backend:
        return
    name = "--all2all-backend" if args.program.has("--all2all-backend") else "VLLM_ALL2ALL_BACKEND"
    args.realise(name, backend, "MoE dispatch")
    if dep.moe.load_balance == "eplb":
        args.add("--enable-eplb", True, "expert-parallel load balancer")
        args.add("--eplb-config", {"num_redundant_experts": dep.moe.redundant_experts},
                 "redundant expert slots")
    else:
        args.realise("--enable-eplb", False, "expert-parallel load balancer")


def _pattern(ranges: tuple[SizeRange, ...], largest: int) -> tuple[int, ...]:
    return tuple(sorted({s for r in ranges for s in range(r.start, min(r.stop or largest, largest) + 1, r.step)}))


def _graphs(a: Assumed, args: Arguments, parts: PlanParts) -> None:
    if not a.engine.overheads.decode_cuda_graph:
        args.add("--enforce-eager", True, "eager mode (no CUDA graphs)")
        return
    args.realise("--enforce-eager", False, "eager mode (no CUDA graphs)")
    sizes = a.graph_sizes
    name = "--cudagraph-capture-sizes" if args.program.has("--cudagraph-capture-sizes") else "--cuda-graph-sizes"
    flag = args.program.find(name)
    assert flag is not None
    if flag.default_sizes and _pattern(flag.default_sizes, sizes[-1]) == sizes and \
            args.program.has("--max-cudagraph-capture-size"):
        args.add("--max-cudagraph-capture-size", sizes[-1], "largest CUDA-graph batch")
        args.derived_default(name, sizes, "CUDA-graph batch sizes")
    else:
        args.add(name, list(sizes), "CUDA-graph batch sizes")
    limit = a.engine.graph_max_batch(a.config.hardware.peak.hbm_bytes, server_tp(a.config.deployment))
    if sizes[-1] < limit:
        parts.note(f"CUDA graphs up to batch {sizes[-1]} (engine card {a.engine.name}: up to {limit}; a scheduler never "
                   f"runs more than its running cap {a.running_cap})")


def _scheduler(a: Assumed, args: Arguments, parts: PlanParts) -> None:
    engine = a.engine
    if a.running_cap:
        add_running_cap(a, args, a.running_cap, "running requests per DP rank")
    else:
        parts.note("running requests: vLLM's own default cap (the simulation assumed none)")
    if a.token_budget:
        args.add("--max-num-batched-tokens", a.token_budget, "token budget per step per DP rank")
    args.realise("--enable-chunked-prefill", a.chunked, "chunked prefill")
    args.add("--gpu-memory-utilization", engine.memory.gpu_memory_utilization, "GPU memory share")
    args.realise("--block-size", engine.scheduler.page_size, "KV block size")
    args.realise("--enable-prefix-caching", a.prefix_cache, "prefix caching")
    method, _k, _draft = speculative(a, args.data)
    overlap = engine.overheads.overlap_scheduler and (not method or engine.overheads.overlap_with_speculative)
    args.realise("--async-scheduling", overlap, "overlap scheduling")
    if overlap and args.data.version.startswith("0.11") and (a.config.deployment.pp > 1 or method):
        parts.note("vLLM 0.11 does not run async scheduling with pipeline parallelism or speculative decoding "
                   "(SchedulerConfig.async_scheduling): the engine will expose CPU time the simulation hid")
    if not a.mixed and a.role != "prefill":
        parts.note("the simulation ran prefill and decode in separate steps; vLLM always mixes them")


def _speculative(a: Assumed, args: Arguments) -> None:
    method, k, draft = speculative(a, args.data)
    if method == "mtp":
        args.add("--speculative-config", {"method": "mtp", "num_speculative_tokens": k}, "speculative decoding (MTP)")
    elif method == "draft":
        args.add("--speculative-config", {"model": draft, "num_speculative_tokens": k}, "speculative decoding (draft model)")


def _server_args(a: Assumed, data: ParserData, parts: PlanParts, port: int) -> tuple[Arguments, Layout, int]:
    check_common(a, data)
    args = Arguments(data.server, data, a.role)
    checkpoint(a, args, parts, online_fp8=True)
    layout = layout_of(a.config)
    tp, dp, ep = check_layout(a.config.deployment, a.config.model, data)
    args.realise("--tensor-parallel-size", tp, "attention TP")
    args.realise("--data-parallel-size", dp, "data-parallel ranks")
    args.realise("--pipeline-parallel-size", layout.pp, "pipeline stages")
    if layout.is_moe:
        args.realise("--enable-expert-parallel", ep, "expert parallelism (EP = TP x DP)")
    _moe(a, args, dp, ep)
    args.realise("--enable-dbo", a.config.deployment.overlap == "two-batch", "two-batch overlap")
    args.realise("--kv-cache-dtype", kv_cache_format(a, data, {"fp8": "fp8"}), "KV-cache format")
    _scheduler(a, args, parts)
    context_limit(a, args, parts, "--max-model-len")
    _graphs(a, args, parts)
    _speculative(a, args)
    if a.role != "server":
        args.add("--kv-transfer-config", PD_KV_TRANSFER, "KV transfer between PD sides")
    if port:
        args.realise("--port", port, "port")
    return args, layout, dp


def _nodes(a: Assumed, args: Arguments, layout: Layout, dp: int, parts: PlanParts) -> None:
    """One command per node: DP ranks by node, or a TP/PP group spanning the nodes (--nnodes)."""
    nodes = node_hosts(a)
    if len(nodes) == 1:
        parts.take(args, where_text(a, a.role))
        return
    local = node_split(layout, dp, args.data)
    if local:
        args.add("--data-parallel-size-local", local)
        args.add("--data-parallel-address", HEAD)
        followers = [args.copy() for _ in nodes[1:]]
        parts.take(args, where_text(a, a.role, nodes[0]))
        for rank, (node, node_args) in enumerate(zip(nodes[1:], followers), start=1):
            node_args.add("--headless")
            node_args.add("--data-parallel-start-rank", rank * local)
            parts.take(node_args, where_text(a, a.role, node), record=False)
        parts.note(f"HEAD_IP: node 0's address; each node runs {local} data-parallel rank(s)")
        return
    args.add("--nnodes", len(nodes))
    args.add("--master-addr", HEAD)
    followers = [args.copy() for _ in nodes[1:]]
    args.add("--node-rank", 0)
    parts.take(args, where_text(a, a.role, nodes[0]))
    for rank, (node, node_args) in enumerate(zip(nodes[1:], followers), start=1):
        node_args.add("--node-rank", rank)
        node_args.add("--headless")
        parts.take(node_args, where_text(a, a.role, node), record=False)
    parts.note("HEAD_IP: node 0's address (the TP x PP group spans the nodes)")


def spell(a: Assumed, data: ParserData, parts: PlanParts, port: int = 0) -> None:
    args, layout, dp = _server_args(a, data, parts, port)
    _nodes(a, args, layout, dp, parts)


def spell_router(prefill_urls: list[str], decode_urls: list[str], data: ParserData, parts: PlanParts, port: int) -> None:
    if data.router is None:
        raise refuse(data, "PD disaggregation", "no router is known in its parser data")
    args = Arguments(data.router, data, "router")
    args.add("--vllm-pd-disaggregation", True, "PD routing")
    args.add("--prefill", [[url] for url in prefill_urls])
    args.add("--decode", [[url] for url in decode_urls])
    args.add("--host", "0.0.0.0")
    args.add("--port", port)
    parts.take(args, "any host that reaches the servers")
