"""Direct flags: a run named on the command line, with or without a config file.

    infersim --model llama-3.1-70b --hardware h100 --num-gpus 8 --tp 8 --engine vllm --isl 2000 --osl 500

A flag sets what it says, on top of the config file when there is one (and `--set` goes last, on
top of both). Layout flags say what a serving engine's flags say, and the rest of the layout
follows from the model (`fit_layout`):

  --tp N            tensor parallelism of attention; the FFN follows: a dense FFN is split over
                    the same N GPUs, routed experts over the whole FFN group (vLLM and SGLang
                    split experts over every GPU of a stage unless expert parallelism is on)
  --dp-attention D  D data-parallel attention replicas per pipeline stage
  --ep E            routed experts spread over E GPUs (MoE models only); the rest of the FFN
                    group splits each expert (SGLang's moe_tp = tp_size / ep_size)
  --pp P            pipeline stages
  --num-gpus G      GPUs in total (default: what the layout flags multiply to, or the config's)

Fields the config file names for its own model are adapted, with a note, when the model is
changed from the command line and they cannot hold for the new one (an MoE example's ffn.ep on a
dense model, a dense FFN narrower than the attention TP group). Fields named on the command line
are never adapted: they are checked, and an impossible one is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from infersim.cards.deployment import DEFAULT_MOE_COMM, AttentionLayout, Deployment, FfnLayout, dp_replicas
from infersim.base.errors import InferSimError

if TYPE_CHECKING:
    from infersim.cards.hardware import HardwareCard
    from infersim.cards.model import ModelCard

#: request lengths a run without a config file and without --isl/--osl takes (announced)
DEFAULT_ISL = 2000
DEFAULT_OSL = 500


#: argparse destinations of the direct flags (all default None), for a namespace made without argparse
FLAG_DESTS = ("model", "hardware", "engine", "num_gpus", "num_nodes", "tp", "dp_attention", "ep", "pp", "isl", "osl",
              "batch_per_gpu", "precision", "kv_cache_dtype")


@dataclass(frozen=True)
class RunFlags:
    """What the direct flags of a command line give (None: not given)."""

    model: str | None = None
    hardware: str | None = None
    engine: str | None = None
    num_gpus: int | None = None
    num_nodes: int | None = None
    tp: int | None = None
    dp_attention: int | None = None
    ep: int | None = None
    pp: int | None = None
    isl: int | None = None
    osl: int | None = None
    batch_per_gpu: int | str | None = None
    precision: str | None = None
    kv_cache_dtype: str | None = None
    calibration: str | None = None

    @property
    def layout(self) -> bool:
        """Whether a layout flag (--tp, --dp-attention, --ep, --pp) is given."""
        return any(v is not None for v in (self.tp, self.dp_attention, self.ep, self.pp))

    @property
    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


#: each layout flag (its RunFlags attribute) and the deployment field it gives
LAYOUT_FLAG_FIELDS = (("tp", "attention.tp"), ("ep", "ffn.ep"), ("pp", "pp"), ("dp_attention", "attention.dp"))


def flag_name(attribute: str) -> str:
    """The command-line flag of a RunFlags attribute (dp_attention -> --dp-attention)."""
    return "--" + attribute.replace("_", "-")


def _layout_fields_decided(flags: RunFlags) -> dict[str, str]:
    """Deployment fields (dotted under deployment) that fit_layout builds from the layout flags -> the
    flag that decides each: the attention and FFN groups are built afresh (their DP sizes derived,
    the FFN split from TP and EP), attention TP, EP and PP kept from the config where their flag is
    not given."""
    tp = f"--tp {flags.tp}" if flags.tp is not None else "the layout flags"
    decided = {"attention.tp": tp, "attention.dp": "the layout flags (--dp-attention)", "ffn.tp": tp,
               "ffn.dp": "the layout flags", "ffn.ep": "the layout flags", "pp": "the layout flags"}
    for attribute, field_ in LAYOUT_FLAG_FIELDS:
        value = getattr(flags, attribute)
        if value is not None:
            decided[field_] = f"{flag_name(attribute)} {value}"
    return decided


def _deployment_leaves(rest: list[str], value: Any) -> list[tuple[str, Any]]:
    """(dotted field under deployment, value) of what one --set below `deployment` gives: its field, or
    the fields of the mapping it gives (deployment.attention={tp: 4}, deployment={pp: 2})."""
    if rest and not isinstance(value, dict):
        return [(".".join(rest), value)]
    if not isinstance(value, dict):
        return []
    out: list[tuple[str, Any]] = []
    for key, item in value.items():
        path = [*rest, str(key)]
        out += _deployment_leaves(path, item) if isinstance(item, dict) else [(".".join(path), item)]
    return out


def refuse_layout_overrides(flags: RunFlags | None, overrides: list[tuple[list[str], Any, str]],
                            dep: Deployment) -> None:
    """Refuse a --set of a layout field (path, value, text: infersim.run.config.parse_overrides)
    whose value the completed deployment `dep` does not have because the layout flags decided it
    otherwise (fit_layout): the command line would name a layout the run does not have. A --set that
    agrees with the flags' layout stands."""
    if flags is None or not flags.layout:
        return
    decided = _layout_fields_decided(flags)
    for path, value, text in overrides:
        if path[0] != "deployment":
            continue
        for field_, given in _deployment_leaves(path[1:], value):
            if field_ not in decided:
                continue
            actual: Any = dep
            for part in field_.split("."):
                actual = getattr(actual, part)
            if actual != given:
                raise InferSimError(f"--set {text}: deployment.{field_} {given!r}, but the run has {actual!r}, decided by "
                                    f"{decided[field_]}; give the layout by the layout flags or by --set, not both")


#: the run-config field each non-layout flag sets (flag_fields) -> the flag
FLAG_OF_FIELD = {"model": "--model", "hardware": "--hardware", "engine": "--engine", "calibration": "--calibration",
                 "deployment.num_gpus": "--num-gpus", "deployment.num_nodes": "--num-nodes", "workload.isl": "--isl",
                 "workload.osl": "--osl", "workload.decode_batch_per_gpu": "--batch-per-gpu",
                 "deployment.precision.kv_cache": "--kv-cache-dtype", "deployment.precision.gemm": "--precision",
                 "deployment.precision.weights": "--precision"}


def flag_fields(flags: RunFlags) -> dict[str, Any]:
    """The run-config fields (dotted) the non-layout flags set."""
    out: dict[str, Any] = {}
    for key, value in (("model", flags.model), ("hardware", flags.hardware), ("engine", flags.engine),
                       ("deployment.num_gpus", flags.num_gpus), ("deployment.num_nodes", flags.num_nodes),
                       ("workload.isl", flags.isl), ("workload.osl", flags.osl),
                       ("workload.decode_batch_per_gpu", flags.batch_per_gpu),
                       ("deployment.precision.kv_cache", flags.kv_cache_dtype), ("calibration", flags.calibration)):
        if value is not None:
            out[key] = value
    if flags.precision is not None:
        out["deployment.precision.gemm"] = flags.precision
        out["deployment.precision.weights"] = flags.precision
    return out


def base_mapping(flags: RunFlags) -> dict[str, Any]:
    """The run config a command line without --config starts from: the flags' cards, the GPUs the
    layout flags multiply to (one without them) and the default request lengths."""
    pp, tp, dp = flags.pp or 1, flags.tp or 1, flags.dp_attention or 1
    gpus = pp * max(tp * dp, flags.ep or 1)
    return {"model": flags.model, "hardware": flags.hardware, "deployment": {"num_gpus": gpus},
            "workload": {"isl": DEFAULT_ISL, "osl": DEFAULT_OSL}}


def _check_layout_flags(flags: RunFlags, gpus: int, pp: int, tp: int, dp: int, model: ModelCard,
                        redundant_experts: int = 0) -> None:
    """A layout the flags give that cannot hold, said with the flags (and config fields) that give
    it, before the deployment's own check names internal fields (attention.dp 0 is 'derived')."""
    gpus_text = f"--num-gpus {gpus}" if flags.num_gpus is not None else f"{gpus} GPUs"
    pp_text = f"--pp {pp}" if flags.pp is not None else f"pp {pp}"
    if gpus % pp:
        raise InferSimError(f"{pp_text}: {pp} pipeline stages do not divide {gpus_text}")
    if flags.pp is not None and model.num_hidden_layers % pp:
        raise InferSimError(f"--pp {pp}: {model.name}'s {model.num_hidden_layers} layers do not divide into {pp} "
                            "pipeline stages")
    stage = gpus // pp
    stage_text = f"the {stage} GPUs of a pipeline stage ({gpus_text}" + (f" / {pp_text})" if pp > 1 else ")")
    group = tp * (dp or 1)
    group_text = f"--tp {tp}" if flags.tp is not None else f"attention tp {tp}"
    if flags.dp_attention is not None:
        group_text += f" x --dp-attention {dp} = {group}"
    if group > stage or stage % group or (dp and group != stage):
        how = "more than" if group > stage else ("fewer than" if dp and group < stage else "does not divide")
        raise InferSimError(f"{group_text}: {how} {stage_text}")
    ep = flags.ep
    if ep is None or not model.is_moe:
        return
    if ep > model.num_experts + redundant_experts:
        extra = f" + {redundant_experts} redundant" if redundant_experts else ""
        raise InferSimError(f"--ep {ep}: more than the {model.num_experts}{extra} routed experts of {model.name} (each "
                            "EP rank holds whole experts; deployment.moe.redundant_experts adds slots)")
    if ep > stage or stage % ep:
        raise InferSimError(f"--ep {ep}: {'more than' if ep > stage else 'does not divide'} {stage_text}")


def fit_layout(dep: Deployment, model: ModelCard, hw: HardwareCard, written: frozenset[str],
               command_line: frozenset[str], flags: RunFlags | None, model_switched: bool,
               ) -> tuple[Deployment, list[str], frozenset[str]]:
    """The deployment with the fields nobody named derived from the model and the layout flags,
    and the config file's fields that cannot hold for a model chosen on the command line adapted.

    `written`: dotted deployment fields (e.g. "ffn.ep", "attention") the config file or --set
    name; `command_line`: those named by --set or a flag (never adapted). Returns the deployment,
    one note per adaptation, and the engine-derived fields (moe_comm) the config file named that no
    longer count as named (they follow the new layout). complete_layout checks the result as ever."""
    notes: list[str] = []
    unnamed: set[str] = set()
    attn, ffn = dep.attention, dep.ffn
    if flags is not None and flags.layout:
        pp = flags.pp or dep.pp
        tp = flags.tp or attn.tp
        dp = flags.dp_attention or 0
        gpus = dep.num_gpus
        if flags.num_gpus is None:
            need = pp * tp * (dp or 1)
            if flags.ep and model.is_moe and flags.ep > tp * (dp or 1):
                need = pp * flags.ep  # EP wider than the attention group: attention DP fills it
            if (dp or gpus % need) and gpus != need:
                notes.append(f"deployment.num_gpus {gpus} -> {need} (what the layout flags give; --num-gpus sets it)")
                gpus = need
        _check_layout_flags(flags, gpus, pp, tp, dp, model, dep.moe.redundant_experts)
        attn = AttentionLayout(tp=tp, dp=dp)
        stage = gpus // pp if gpus % pp == 0 else 0
        if model.is_moe:
            kept = ffn.ep if "ffn.ep" in written and ffn.ep > 1 and stage and stage % ffn.ep == 0 else 1
            ep = flags.ep or kept
            ffn = FfnLayout(tp=stage // ep if stage and stage % ep == 0 else 1, ep=ep, dp=0)
        else:
            if flags.ep and flags.ep > 1:
                raise InferSimError(f"--ep {flags.ep}: expert parallelism needs an MoE model ({model.name} is dense)")
            ffn = FfnLayout(tp=tp, ep=1, dp=0)
        dep = replace(dep, num_gpus=gpus, pp=pp, attention=attn, ffn=ffn)
        if "moe_comm" in written and "moe_comm" not in command_line and model.is_moe:
            notes.append(f"deployment.moe_comm {dep.moe_comm} of the config file dropped: the layout flags give a new "
                         "layout, and its MoE path follows from it and the engine")
            dep = replace(dep, moe_comm=DEFAULT_MOE_COMM)
            unnamed.add("moe_comm")
    else:
        if not model.is_moe and ffn.ep > 1 and model_switched and "ffn.ep" not in command_line:
            notes.append(f"deployment.ffn.ep {ffn.ep} of the config file dropped: {model.name} is dense (no experts "
                         "to spread)")
            ffn = replace(ffn, ep=1, dp=0)
        if "ffn.tp" not in written and ffn.tp < attn.tp and (not model.is_moe or "ffn.ep" not in written):
            # nobody split the FFN: the engines split it (dense, or experts without EP) like attention
            ffn = replace(ffn, tp=attn.tp, dp=0 if "ffn.dp" not in written else ffn.dp)
        elif (model_switched and model.num_dense_layers and ffn.tp < attn.tp and "ffn.tp" not in command_line):
            notes.append(f"deployment.ffn.tp {ffn.tp} of the config file -> {attn.tp}: the dense FFN of {model.name} "
                         "spans the attention TP group")
            ffn = replace(ffn, tp=attn.tp, dp=0)
        dep = replace(dep, ffn=ffn)
    if "num_nodes" not in written and dep.num_gpus > hw.peak.gpus_per_node and dep.num_gpus % hw.peak.gpus_per_node == 0:
        nodes = dep.num_gpus // hw.peak.gpus_per_node
        notes.append(f"deployment.num_nodes {nodes}: {dep.num_gpus} GPUs fill {nodes} {hw.name} nodes of "
                     f"{hw.peak.gpus_per_node}")
        dep = replace(dep, num_nodes=nodes)
    if flags is not None:
        _check_node_flags(flags, dep, hw, "num_nodes" in written)
    return dep, notes, frozenset(unnamed)


def _check_node_flags(flags: RunFlags, dep: Deployment, hw: HardwareCard, nodes_written: bool) -> None:
    """--num-gpus and --num-nodes against the machine, said with the flags (complete_layout would name
    deployment.num_nodes, which the user may not have written)."""
    if flags.num_gpus is None and flags.num_nodes is None:
        return
    gpus_text = f"--num-gpus {dep.num_gpus}" if flags.num_gpus is not None else f"{dep.num_gpus} GPUs"
    per_node = hw.peak.gpus_per_node
    if flags.num_nodes is not None and dep.num_gpus % flags.num_nodes:
        raise InferSimError(f"--num-nodes {flags.num_nodes}: does not divide {gpus_text}")
    if dep.num_gpus // dep.num_nodes <= per_node or (dep.num_gpus % dep.num_nodes):
        return
    if flags.num_nodes is not None:
        raise InferSimError(f"--num-nodes {flags.num_nodes}: {dep.num_gpus // dep.num_nodes} GPUs per node "
                            f"({gpus_text}), but a {hw.name} node holds {per_node}")
    if flags.num_gpus is not None and not nodes_written:
        raise InferSimError(f"--num-gpus {dep.num_gpus}: more than one {hw.name} node's {per_node} GPUs, and not "
                            f"whole nodes of {per_node}")


def replicas_note(dep: Deployment, model: ModelCard) -> str:
    """What a layout of DP replicas runs ('' for any other layout): independent copies of the model,
    as vLLM's --data-parallel-size on a dense model and SGLang's --dp without --enable-dp-attention
    launch them, not DP attention."""
    if not dp_replicas(dep):
        return ""
    dp, tp = dep.attention.dp, dep.attention.tp
    stage = dep.gpus_per_stage
    shared = (f"--dp-attention {dp} --ep {stage}" if model.is_moe else
              f"--set deployment.num_gpus={dep.num_gpus} --set deployment.attention.dp={dp} "
              f"--set deployment.ffn.tp={stage} (the layout given by --set alone)")
    return (f"attention DP{dp} with FFN TP{dep.ffn.tp}" + (f" x EP{dep.ffn.ep}" if dep.ffn.ep > 1 else "")
            + f" = attention TP{tp}: {dp} independent replicas of the model, each with its own scheduler and LM head "
            "and no communication between them (vLLM --data-parallel-size, SGLang --dp without --enable-dp-attention); "
            f"DP attention, one FFN group shared by the DP ranks, is {shared}")

