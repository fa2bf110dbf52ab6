"""The serving workload form: load stages and what each request holds, as a mapping (YAML/JSON).

    load:
      timer: poisson | vllm | constant | ip-poisson     # how a stage's sends are spaced (infersim.serve.profiles)
      burstiness: 1                                      # gamma shape of poisson / vllm gaps
      stages:                                            # one after the other; each drains before the next
        - {rate: 2.5, duration_s: 600}                   # int(rate x duration) requests (inference-perf)
        - {rate: 6, num_requests: 3600}                  # or a count
        - {concurrency: 32, num_requests: 1000}          # or a closed loop
        - {rate: 1, duration_s: 120, lead_s: 60, tail_s: 60}   # 60 s more at the rate before and after, not counted
      ramp_up: {strategy: linear, start_rps: 1, end_rps: 20}   # vllm timer, one stage of num_requests (no rate:
                                                               # the ramp sets it)
      interval_s: 1                                      # pause between stages
    data:                                                # one of
      type: random              input: LEN, output: LEN, prefix_tokens: 0 (shared by every request)
      type: prefix_repetition   num_prefixes, prefix_len, suffix_len, output_len
      type: shared_prefix       num_groups, prompts_per_group, system_prompt_len, question_len, output_len,
                                multi_turn: false, order: cycle | once | fresh
      type: sessions            num_system_prompts, system_prompt_len, turns, question_len, output_len,
                                think_time_s
    max_model_len: N            # longer requests are rejected on arrival or cut, as the engine's server does

LEN is a whole number or a length distribution (infersim.serve.workload.length_dist: fixed,
uniform, normal, lognormal with min/max, empirical from a file); think_time_s a number of seconds
or {dist: exponential, mean: S}. Stage semantics are inference-perf's (loadgen/load_generator.py):
a stage sends its requests on its timer, ends when all of them are done, and the next one starts
`interval_s` later; the prefix cache carries over, sessions start afresh. What the data types mean
is in infersim.serve.datasets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from infersim.base.errors import InferSimError, echo
from infersim.base.texttable import counted
from infersim.serve.profiles import RAMPS, TIMERS, Ramp
from infersim.serve.workload import MAX_REQUESTS, MAX_SPAN_S, LengthDist, check_rate, length_dist

DATA_TYPES = ("random", "prefix_repetition", "shared_prefix", "sessions")
#: most prompts a shared_prefix generator holds: every prompt's lengths are drawn and the list is
#: shuffled before the first request is sent (some 10 us a prompt), whatever number the stages send
MAX_PROMPTS = 1_000_000
#: most turns of one conversation (a session, or a multi-turn user's rounds): turn t's prompt holds
#: every earlier turn, so a conversation costs the square of its turns
MAX_TURNS = 10_000


@dataclass(frozen=True)
class StageSpec:
    rate: float | None = None  # requests (sessions, for data type sessions) per second
    duration_s: float | None = None
    num_requests: int | None = None
    concurrency: int | None = None  # closed loop: clients, each sending when its last request ends
    # seconds of arrivals at the stage's rate before and after its duration_s, simulated and not
    # counted: a window cut from a longer stage sees the server as that stage does, past its
    # first requests and before its last ones drain
    lead_s: float = 0.0
    tail_s: float = 0.0

    @property
    def windowed(self) -> bool:
        return bool(self.lead_s or self.tail_s)

    def sent(self) -> StageSpec:
        """The stage as sent: its lead-in, duration and tail as one duration at its rate."""
        assert self.duration_s is not None
        return StageSpec(self.rate, self.lead_s + self.duration_s + self.tail_s)

    @property
    def count(self) -> int:
        if self.num_requests is not None:
            return self.num_requests
        assert self.rate is not None and self.duration_s is not None
        return int(self.rate * self.duration_s)

    def describe(self) -> str:
        if self.concurrency is not None:
            return f"{counted(self.count, 'request')} from {counted(self.concurrency, 'client')}"
        if self.rate is None:  # a ramp's stage: the workload names the ramp
            return f"{self.count:,} sent"
        what = f"{self.rate:g}/s"
        what += f" for {self.duration_s:g} s" if self.duration_s is not None else f", {self.count:,} sent"
        if self.windowed:
            what += f" (counted; {self.lead_s:g} s before and {self.tail_s:g} s after at that rate, not counted)"
        return what


@dataclass(frozen=True)
class ThinkTime:
    mean_s: float
    exponential: bool = False

    def describe(self) -> str:
        return f"{'exponential, mean ' if self.exponential else ''}{self.mean_s:g} s"


@dataclass(frozen=True)
class DataSpec:
    type: str
    input: LengthDist | None = None  # random
    output: LengthDist | None = None  # random, prefix_repetition, shared_prefix, sessions
    prefix_tokens: int = 0  # random: one prefix every request starts with
    num_prefixes: int = 0  # prefix_repetition
    prefix_len: int = 0
    suffix_len: int = 0
    num_groups: int = 0  # shared_prefix / sessions (system prompts)
    prompts_per_group: int = 0  # shared_prefix
    system_prompt_len: LengthDist | None = None
    question_len: LengthDist | None = None
    multi_turn: bool = False
    # shared_prefix: cycle through the prompts (inference-perf), send each once (SGLang), or a new
    # question after the system prompt every request (fresh: fixed-length rounds, no question repeats)
    order: str = "cycle"
    turns: LengthDist | None = None  # sessions
    think_time: ThinkTime | None = None


@dataclass(frozen=True)
class WorkloadSpec:
    stages: tuple[StageSpec, ...]
    data: DataSpec
    timer: str = "poisson"
    burstiness: float = 1.0
    ramp: Ramp | None = None
    interval_s: float = 1.0
    max_model_len: int | None = None
    notes: tuple[str, ...] = field(default=())  # what a reader of another tool's file left out

    @property
    def total_requests(self) -> int:
        return sum(s.count for s in self.stages)

    def describe(self) -> str:
        d = self.data
        what = {"random": "random lengths" + (f" after a shared {d.prefix_tokens:,}-token prefix" if d.prefix_tokens else ""),
                "prefix_repetition": counted(d.num_prefixes, "repeated prefix", "repeated prefixes"),
                "shared_prefix": f"{d.num_groups:,} x {counted(d.prompts_per_group, 'shared-prefix prompt')}"
                                 + (", multi-turn" if d.multi_turn else ""),
                "sessions": f"chat sessions, {counted(d.num_groups, 'system prompt')}"}[d.type]
        stages = ", then ".join(s.describe() for s in self.stages)
        ramp = f", ramp {self.ramp.strategy} {self.ramp.start_rps:g} to {self.ramp.end_rps:g}/s" if self.ramp else ""
        return f"{what}; {self.timer} timer: {stages}{ramp}"


def _keys(spec: Any, where: str, allowed: set[str], required: tuple[str, ...] = ()) -> Mapping[str, Any]:
    if not isinstance(spec, Mapping):
        raise InferSimError(f"{where}: expected a mapping (got {echo(spec)})")
    unknown = sorted(map(str, set(spec) - allowed))
    if unknown:
        raise InferSimError(f"{where}: unknown key(s) {unknown}; expected {', '.join(sorted(allowed))}")
    missing = [k for k in required if k not in spec]
    if missing:
        raise InferSimError(f"{where}: needs {', '.join(missing)}")
    return spec


def _whole(value: Any, where: str, minimum: int = 1) -> int:
    from infersim.cards.schema import check_number
    from infersim.base.errors import ConfigError

    if isinstance(value, bool) or value is None:
        raise InferSimError(f"{where}: expected a whole number >= {minimum} (got {echo(value)})")
    try:
        number = int(check_number(value, where, "", whole=True, ge=minimum))
    except ConfigError as exc:
        raise InferSimError(f"{where}: {echo(value)}: {exc.problem}") from None
    return number


def _seconds(value: Any, where: str, positive: bool = True) -> float:
    from infersim.cards.schema import check_number
    from infersim.base.errors import ConfigError

    if isinstance(value, bool) or value is None:
        raise InferSimError(f"{where}: expected a number of seconds (got {echo(value)})")
    try:
        return float(check_number(value, where, "", **({"gt": 0} if positive else {"ge": 0})))
    except ConfigError as exc:
        raise InferSimError(f"{where}: {echo(value)}: {exc.problem}") from None


def parse_stage(spec: Any, where: str, ramped: bool = False) -> StageSpec:
    """One stage; `ramped`: the load's ramp_up sets its rate, and the stage gives its num_requests only."""
    s = _keys(spec, where, {"rate", "duration_s", "num_requests", "concurrency", "lead_s", "tail_s"})
    if ramped:
        return _ramped_stage(s, where)
    rate = check_rate(s["rate"], f"{where}.rate") if s.get("rate") is not None else None
    duration = _seconds(s["duration_s"], f"{where}.duration_s") if s.get("duration_s") is not None else None
    count = _whole(s["num_requests"], f"{where}.num_requests") if s.get("num_requests") is not None else None
    clients = _whole(s["concurrency"], f"{where}.concurrency") if s.get("concurrency") is not None else None
    if clients is not None:
        if count is None or rate is not None or duration is not None:
            raise InferSimError(f"{where}: a closed-loop stage takes concurrency and num_requests only")
    elif rate is None or (duration is None) == (count is None):
        raise InferSimError(f"{where}: give rate with duration_s or with num_requests (or concurrency with "
                            "num_requests)")
    lead = _seconds(s["lead_s"], f"{where}.lead_s", positive=False) if s.get("lead_s") is not None else 0.0
    tail = _seconds(s["tail_s"], f"{where}.tail_s", positive=False) if s.get("tail_s") is not None else 0.0
    if (lead or tail) and duration is None:
        raise InferSimError(f"{where}: lead_s and tail_s extend a stage of rate and duration_s at its rate")
    stage = StageSpec(rate, duration, count, clients, lead, tail)
    if stage.count < 1 or stage.count > MAX_REQUESTS:
        raise InferSimError(f"{where}: {stage.count:,} requests (int(rate x duration)); a stage sends 1 to "
                            f"{MAX_REQUESTS:,}")
    if stage.windowed and stage.sent().count > MAX_REQUESTS:
        raise InferSimError(f"{where}: {stage.sent().count:,} requests with lead_s and tail_s (int(rate x "
                            f"(lead_s + duration_s + tail_s))); a stage sends at most {MAX_REQUESTS:,}")
    return stage


def _ramped_stage(s: Mapping[str, Any], where: str) -> StageSpec:
    """The one stage of a ramp (vllm bench serve's --ramp-up-strategy): num_requests sent at the rate the
    ramp reaches, request by request; a rate, duration or concurrency of its own would not be read."""
    for key, why in (("rate", "the ramp sets the rate, from start_rps to end_rps (vllm bench serve refuses "
                              "--request-rate with a ramp)"),
                     ("duration_s", "the ramp sends num_requests, however long they take"),
                     ("concurrency", "a ramp is an open loop"), ("lead_s", "a ramp has no lead-in"),
                     ("tail_s", "a ramp has no tail")):
        if s.get(key) is not None:
            raise InferSimError(f"{where}.{key}: {echo(s[key])} with load.ramp_up: {why}; give the stage "
                                "num_requests only")
    if s.get("num_requests") is None:
        raise InferSimError(f"{where}: a stage under load.ramp_up gives num_requests (the ramp sets the rate)")
    return StageSpec(num_requests=_whole(s["num_requests"], f"{where}.num_requests"))


def _think_time(value: Any, where: str) -> ThinkTime:
    if isinstance(value, Mapping):
        s = _keys(value, where, {"dist", "mean"}, ("dist", "mean"))
        if s["dist"] not in ("fixed", "exponential"):
            raise InferSimError(f"{where}.dist: {echo(s['dist'])} is not fixed or exponential")
        return ThinkTime(_seconds(s["mean"], f"{where}.mean", positive=False), s["dist"] == "exponential")
    return ThinkTime(_seconds(value, where, positive=False))


_DATA_KEYS = {
    "random": ({"input", "output", "prefix_tokens"}, ("input", "output")),
    "prefix_repetition": ({"num_prefixes", "prefix_len", "suffix_len", "output_len"},
                          ("num_prefixes", "prefix_len", "suffix_len", "output_len")),
    "shared_prefix": ({"num_groups", "prompts_per_group", "system_prompt_len", "question_len", "output_len",
                       "multi_turn", "order"}, ("num_groups", "prompts_per_group", "system_prompt_len", "question_len",
                                                "output_len")),
    "sessions": ({"num_system_prompts", "system_prompt_len", "turns", "question_len", "output_len", "think_time_s"},
                 ("system_prompt_len", "turns", "question_len", "output_len")),
}


def parse_data(spec: Any, where: str = "workload.data") -> DataSpec:
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if kind not in DATA_TYPES:
        raise InferSimError(f"{where}.type: {echo(kind)} is not one of {', '.join(DATA_TYPES)}")
    allowed, required = _DATA_KEYS[kind]
    s = _keys(spec, where, allowed | {"type"}, required)

    def dist(key: str) -> LengthDist:
        return length_dist(s[key], f"{where}.{key}")

    if kind == "random":
        return DataSpec(kind, input=dist("input"), output=dist("output"),
                        prefix_tokens=_whole(s.get("prefix_tokens", 0), f"{where}.prefix_tokens", 0))
    if kind == "prefix_repetition":
        return DataSpec(kind, output=dist("output_len"), num_prefixes=_whole(s["num_prefixes"], f"{where}.num_prefixes"),
                        prefix_len=_whole(s["prefix_len"], f"{where}.prefix_len", 0),
                        suffix_len=_whole(s["suffix_len"], f"{where}.suffix_len", 0))
    if kind == "shared_prefix":
        _check_prompts(s, where)
        order = s.get("order", "cycle")
        if order not in ("cycle", "once", "fresh"):
            raise InferSimError(f"{where}.order: {echo(order)} is not cycle, once or fresh")
        multi = s.get("multi_turn", False)
        if not isinstance(multi, bool):
            raise InferSimError(f"{where}.multi_turn: expected true or false (got {echo(multi)})")
        return DataSpec(kind, output=dist("output_len"), num_groups=_whole(s["num_groups"], f"{where}.num_groups"),
                        prompts_per_group=_whole(s["prompts_per_group"], f"{where}.prompts_per_group"),
                        system_prompt_len=_zero_or_dist(s["system_prompt_len"], f"{where}.system_prompt_len"),
                        question_len=dist("question_len"), multi_turn=multi, order=order)
    return DataSpec(kind, output=dist("output_len"), question_len=dist("question_len"),
                    turns=_turns(dist("turns"), f"{where}.turns"),
                    num_groups=_whole(s.get("num_system_prompts", 1), f"{where}.num_system_prompts"),
                    system_prompt_len=_zero_or_dist(s["system_prompt_len"], f"{where}.system_prompt_len"),
                    think_time=_think_time(s.get("think_time_s", 0), f"{where}.think_time_s"))


def _check_prompts(s: Mapping[str, Any], where: str) -> None:
    groups = _whole(s["num_groups"], f"{where}.num_groups")
    per_group = _whole(s["prompts_per_group"], f"{where}.prompts_per_group")
    if groups * per_group > MAX_PROMPTS:
        raise InferSimError(f"{where}: num_groups {groups:,} x prompts_per_group {per_group:,} = "
                            f"{groups * per_group:,} prompts; at most {MAX_PROMPTS:,} (every prompt is drawn and the "
                            "list shuffled before the first request is sent)")


def _turns(turns: LengthDist, where: str) -> LengthDist:
    """A session's turn count, within MAX_TURNS: the largest a distribution can draw where it has one
    (a number, a max, a uniform or empirical one), else its mean (a larger draw is refused as drawn)."""
    largest = turns.high or turns.mean
    if largest > MAX_TURNS:
        what = ("" if turns.dist == "fixed" else f" (max {turns.high:,})" if turns.high
                else f" (mean {turns.mean:,.6g})")
        raise InferSimError(f"{where}: {turns.describe()}{what}: a session runs at most {MAX_TURNS:,} turns (turn "
                            "t's prompt holds every earlier turn, so a session costs the square of its turns)")
    return turns


def _zero_or_dist(value: Any, where: str) -> LengthDist:
    """A length that may be 0 (no system prompt)."""
    if value == 0 and not isinstance(value, bool):
        return LengthDist("fixed", 0.0, 0.0, 0, 0)
    return length_dist(value, where)


def _ramp(spec: Any, where: str) -> Ramp:
    s = _keys(spec, where, {"strategy", "start_rps", "end_rps"}, ("strategy", "start_rps", "end_rps"))
    if s["strategy"] not in RAMPS:
        raise InferSimError(f"{where}.strategy: {echo(s['strategy'])} is not one of {', '.join(RAMPS)}")
    start, end = check_rate(s["start_rps"], f"{where}.start_rps"), check_rate(s["end_rps"], f"{where}.end_rps")
    check_ramp_rises(start, end, f"{where}: start_rps {start:g} is above end_rps {end:g} (--ramp-up-start-rps / "
                     "--ramp-up-end-rps)")
    return Ramp(s["strategy"], start, end)


def check_ramp_rises(start: float, end: float, given: str) -> None:
    """Refuse a ramp-up whose start rate is above its end; `given` names the two rates as the user
    wrote them (the workload's keys, or the --ramp-up flags)."""
    if start > end:  # vllm benchmarks/serve.py main_async(): "Ramp-up start RPS must be less than end RPS"
        raise InferSimError(f"{given}: a ramp-up rises from its start to its end, and vllm bench serve refuses a "
                            "start above the end")


def parse_workload(spec: Any, where: str = "workload") -> WorkloadSpec:
    """Our workload form (module docstring) -> WorkloadSpec; one clear message for a bad value."""
    if isinstance(spec, WorkloadSpec):
        return spec
    s = _keys(spec, where, {"load", "data", "max_model_len", "notes"}, ("load", "data"))
    load = _keys(s["load"], f"{where}.load", {"timer", "burstiness", "stages", "ramp_up", "interval_s"}, ("stages",))
    timer = load.get("timer", "poisson")
    if timer not in TIMERS:
        raise InferSimError(f"{where}.load.timer: {echo(timer)} is not one of {', '.join(TIMERS)}")
    stages_raw = load["stages"]
    if not isinstance(stages_raw, list) or not stages_raw:
        raise InferSimError(f"{where}.load.stages: expected a list of one or more stages (got {echo(stages_raw)})")
    ramp = _ramp(load["ramp_up"], f"{where}.load.ramp_up") if load.get("ramp_up") is not None else None
    if ramp is not None and (timer != "vllm" or len(stages_raw) != 1):
        raise InferSimError(f"{where}.load.ramp_up: a ramp (vllm bench serve's) takes timer vllm and one stage of "
                            "num_requests")
    stages = tuple(parse_stage(st, f"{where}.load.stages[{i}]", ramp is not None) for i, st in enumerate(stages_raw))
    if timer == "constant" and any(st.duration_s is None for st in stages if st.concurrency is None):
        raise InferSimError(f"{where}.load: timer constant spreads a stage over its duration_s; give each stage one")
    burst = _seconds(load.get("burstiness", 1.0), f"{where}.load.burstiness")
    max_len = _whole(s["max_model_len"], f"{where}.max_model_len", 2) if s.get("max_model_len") is not None else None
    notes = s.get("notes") or ()
    if not isinstance(notes, (list, tuple)) or not all(isinstance(n, str) for n in notes):
        raise InferSimError(f"{where}.notes: expected a list of sentences (got {echo(notes)})")
    data = parse_data(s["data"], f"{where}.data")
    stages, fitted = _fit_stages(stages, data, where)
    interval = _interval(load.get("interval_s", 1.0), len(stages), f"{where}.load.interval_s")
    return WorkloadSpec(stages, data, timer, burst, ramp, interval, max_len, tuple(notes) + tuple(fitted))


def _interval(value: Any, stages: int, where: str) -> float:
    """The pause between stages: 0 or more seconds, and the pauses together within the serving clock's
    span (MAX_SPAN_S), where the run's later stages would start past what it resolves."""
    interval = _seconds(value, where, positive=False)
    pauses = max(stages - 1, 1)
    if interval * pauses > MAX_SPAN_S:
        raise InferSimError(f"{where}: {echo(value)}: {pauses:,} pause(s) of {interval:.3g} s between stages span "
                            f"{interval * pauses:.3g} s, beyond the {MAX_SPAN_S:.3g} s (285 years) the serving clock "
                            "resolves to a microsecond (float64 seconds); a pause at most "
                            f"{MAX_SPAN_S / pauses:.3g} s")
    return interval


def _fit_stages(stages: tuple[StageSpec, ...], data: DataSpec, where: str) -> tuple[tuple[StageSpec, ...], list[str]]:
    """The stages as the data sends them, with a note for each count the data type changes; counts it
    cannot send, or conversations longer than MAX_TURNS, are refused."""
    notes: list[str] = []
    fitted = []
    for i, stage in enumerate(stages):
        at = f"{where}.load.stages[{i}]"
        sent = stage.sent().count if stage.windowed else stage.count
        if data.type == "prefix_repetition":
            stage = _repeated_prefixes(stage, sent, data.num_prefixes, at, where, notes)
        elif data.type == "sessions":
            assert data.turns is not None
            if sent * data.turns.mean > MAX_REQUESTS:
                raise InferSimError(f"{at}: {sent:,} sessions x {data.turns.mean:,.6g} turns (mean of {where}.data."
                                    f"turns) = {sent * data.turns.mean:,.0f} requests; a stage sends at most "
                                    f"{MAX_REQUESTS:,}")
        elif data.multi_turn and data.order != "once":  # once: every prompt sent once, one round each
            users = data.num_groups * data.prompts_per_group
            rounds = -(-sent // users)
            if rounds > MAX_TURNS:
                raise InferSimError(f"{at}: {sent:,} requests over {users:,} multi-turn user(s) (num_groups x "
                                    f"prompts_per_group) are up to {rounds:,} rounds each; a conversation runs at most "
                                    f"{MAX_TURNS:,} (each round's prompt holds every earlier one)")
        fitted.append(stage)
    return tuple(fitted), notes


def _repeated_prefixes(stage: StageSpec, sent: int, prefixes: int, at: str, where: str, notes: list[str]) -> StageSpec:
    """vllm bench serve's PrefixRepetitionRandomDataset makes num_requests // num_prefixes prompts per
    prefix and refuses fewer requests than prefixes: a stage sends the whole multiple of its prefixes."""
    if sent < prefixes:
        raise InferSimError(f"{at}: {sent:,} requests with {where}.data.num_prefixes {prefixes:,}: prefix_repetition "
                            "sends num_prefixes x (requests // num_prefixes) requests, none here (vllm bench serve "
                            f"refuses fewer requests than prefixes); send at least {prefixes:,}")
    kept = sent // prefixes * prefixes
    if kept == sent:
        return stage
    notes.append(f"{at}: prefix_repetition sends num_prefixes x (requests // num_prefixes) = {kept:,} of its "
                 f"{sent:,} requests ({sent // prefixes:,} after each of {prefixes:,} prefixes), as vllm bench serve's "
                 "PrefixRepetitionRandomDataset makes them")
    if stage.num_requests is not None:
        return replace(stage, num_requests=kept)
    return stage
