"""What every engine's speller shares: the checks of what no flag can express, the precision, the
speculative drafter and the per-node placement of a multi-node server."""

from __future__ import annotations

from infersim.base.errors import ConfigError, InferSimError
from infersim.base.texttable import counted
from infersim.launch.assumed import Assumed, Checkpoint, checkpoint_choice
from infersim.cards.engine_parser import ParserData
from infersim.launch.plan import Arguments, PlanParts

#: placeholders the user replaces with a host's address (the shell expands them when exported)
HEAD = "$HEAD_IP"


class LaunchRefusal(InferSimError):
    """What an engine's flags cannot express: `what` names it (a layout, a path), `why` says why in words
    that do not repeat it, so that equal reasons of different layouts group together (a layout search)."""

    def __init__(self, title: str, what: str, why: str) -> None:
        self.title = title
        self.what = what
        self.why = why
        super().__init__(f"--emit-launch: {title} cannot run {what}: {why}")


def refuse(data: ParserData, layout_text: str, why: str) -> LaunchRefusal:
    return LaunchRefusal(data.title, layout_text, why)


def add_running_cap(a: Assumed, args: Arguments, value: int, fact: str) -> None:
    """Set the server's running-request cap by the flag the engine card names (scheduler.running_cap_flag),
    one of the parser's whole-number flags; a card that names none, or another, is an error naming
    its file, key and value."""
    flag, data, source = a.engine.scheduler.running_cap_flag, args.data, _card_file(a)
    if not flag:
        raise InferSimError(f"--emit-launch: engine card {a.engine.name} names no flag that sets {data.title}'s "
                            f"running-request cap (scheduler.running_cap_flag), and the simulation ran a cap of "
                            f"{a.running_cap}: the command cannot be spelled")
    what = args.program.lacks_whole_number(flag)
    if what:
        raise ConfigError(source, "scheduler.running_cap_flag", flag,
                          f"--emit-launch: {data.title}'s parser has {what} (engines/launch/{data.framework}-"
                          f"{data.version}.yaml): the running-request cap of {value} the simulation ran cannot be set")
    args.add(flag, value, fact, named_by=f"{source}: scheduler.running_cap_flag names it for the running-request cap")


def _card_file(a: Assumed) -> str:
    """The engine card's file (or how the run named the card), for a message about one of its fields."""
    return a.config.engine_source or f"engine card {a.engine.name} {a.engine.version}"


def check_common(a: Assumed, data: ParserData) -> None:
    """What the simulation can model and no engine flag sets."""
    dep = a.config.deployment
    if dep.weight_offload != "none":
        raise refuse(data, "this deployment", "the simulated weight offload (deployment.weight_offload auto) streams "
                                              "weights InferSim's way, which no engine flag sets")
    if dep.moe.load_balance == "ideal" and a.config.model.is_moe and dep.ffn.ep > 1:
        note = "the simulation assumed an ideal (even) expert load; no engine flag makes routing even"
        raise refuse(data, "this deployment", note + " (set deployment.moe.load_balance statistical or eplb)")


def checkpoint(a: Assumed, args: Arguments, parts: PlanParts, online_fp8: bool) -> Checkpoint:
    """The checkpoint as the model argument, and `--quantization fp8` where the engine quantises it
    while loading (refused where it cannot: `online_fp8` False)."""
    choice = checkpoint_choice(a.config)
    if choice.online_quantization and not online_fp8:
        raise refuse(args.data, "fp8 weights from an unquantised checkpoint",
                     f"it loads pre-quantised checkpoints only; name one with --set "
                     f"model.quantized_checkpoints.fp8=REPO (model card {a.config.model.name} names none)")
    args.model(choice.repository)
    if choice.online_quantization:
        args.add("--quantization", choice.online_quantization, "weights quantised to fp8 while loading")
    parts.note(choice.note)
    return choice


def kv_cache_format(a: Assumed, data: ParserData, spellings: dict[str, str]) -> str:
    """The engine's name for the run's KV-cache format ('auto' = the checkpoint's own)."""
    kv = a.config.deployment.precision.kv_cache
    model_dtype = "bf16"  # every bundled checkpoint's activations; a run's fp16 KV cache is the one exception
    if kv == model_dtype:
        return "auto"
    if kv not in spellings:
        raise refuse(data, f"a {kv} KV cache", f"no {data.title} KV-cache format of that name is known to InferSim")
    return spellings[kv]


def context_limit(a: Assumed, args: Arguments, parts: PlanParts, name: str) -> None:
    """The serving run's max_model_len as the engine's context flag `name`, at the value that makes the
    engine run whole what the simulation ran whole (prompt + output <= max_model_len): the tokens the
    engine card's context_limit keeps free above it where the engine refuses prompt + output >= its
    context length or cuts the output short of it (SGLang); the simulation serves at that value
    (infersim.serve.admission). Above the model's context the engine starts only with the card's
    override setting. Without a max_model_len nothing is set: the engine's default is the model's
    context, the simulation's too."""
    limit = a.max_model_len
    if not limit:
        return
    rule, engine = a.engine.context_limit, a.engine
    kept = rule.kept_free()
    value = rule.server_context(limit)
    fact = "longest request, prompt + output tokens"
    if kept:
        why = (f"cuts a request's output to end {rule.output_margin} tokens short of {name}"
               if rule.output_margin >= rule.reserved_tokens else
               f"refuses prompt + output above {name} less {rule.reserved_tokens}")
        fact = (f"longest request run whole {limit} tokens, prompt + output ({engine.name} {engine.version} {why}, "
                f"so {limit} + {kept})")
    args.add(name, value, fact)
    _above_context(a, args, parts, f"{name} {value:,}", value)


def _above_context(a: Assumed, args: Arguments, parts: PlanParts, flag_text: str, value: int) -> None:
    """The engine card's override setting (context_limit.override, VARIABLE=VALUE) where the
    context flag's value is above the model's context (max_position_embeddings), which the engine
    refuses to start with otherwise; a note where the card names none, or the model card no context."""
    engine, model = a.engine, a.config.model
    context = model.max_position_embeddings
    override = engine.context_limit.override
    if context and value <= context:
        return
    if not context:
        if override:
            parts.note(f"model card {model.name} states no context length (max_position_embeddings 0): if {flag_text} "
                       f"is above the checkpoint's, {args.data.title} starts only with {override}")
        return
    above = f"{flag_text} is above model {model.name}'s context of {context:,} tokens (max_position_embeddings)"
    if not override:
        parts.note(f"{above}: engine card {engine.name} names no setting that lets {args.data.title} start with it, "
                   "and it may refuse to")
        return
    variable, _, setting = override.partition("=")
    if not (variable and setting):
        raise InferSimError(f"--emit-launch: engine card {engine.name}: context_limit.override {override!r} "
                            "is not VARIABLE=VALUE")
    args.add(variable, setting, f"context above the model's {context:,} tokens allowed",
             named_by=f"{_card_file(a)}: context_limit.override names it for the context above the model's")
    if a.max_model_len <= context:
        kept = value - a.max_model_len
        parts.note(f"{above} only by the {counted(kept, 'token')} {args.data.title} keeps free: {override} "
                   "lets it start, and no request it admits goes past the model's context")
    else:
        parts.note(f"{above}: {override} lets it start; the model's output past its trained context is not assured")


def speculative(a: Assumed, data: ParserData) -> tuple[str, int, str]:
    """(method 'mtp' or 'draft', lookahead k, draft checkpoint) of the run's speculative decoding, or
    ('', 0, '') without."""
    spec = a.config.speculative
    if spec is None:
        return "", 0, ""
    k = a.lookahead or (spec.lookahead if isinstance(spec.lookahead, int) else 0)
    if not k:
        raise refuse(data, "lookahead auto", "the lookahead the simulation chose is not known here: give "
                                             "speculative.lookahead a number")
    if spec.method == "mtp":
        return "mtp", k, ""
    draft = a.config.draft_model
    if draft is None or not draft.checkpoint:
        name = draft.name if draft is not None else "the draft model"
        raise InferSimError(f"--emit-launch: model card {name} names no checkpoint for the drafter: "
                            "give one with its card's checkpoint field")
    return "draft", k, draft.checkpoint


def node_hosts(a: Assumed) -> list[str]:
    nodes = a.config.deployment.num_nodes
    return [f"node {i} of {nodes}" for i in range(nodes)]


def where(a: Assumed, role: str, node: str = "") -> str:
    """Which hosts run a command: each of a pool's instances, and which node of each ('' for one server
    on one node)."""
    pool = f"each of the {a.instances} {role} instances" if a.instances > 1 else ""
    if node:
        return f"{node}, {pool}" if pool else node
    return pool
