"""What the requests of a workload hold, stage by stage: lengths and token identity (segments).

Data types (infersim.serve.workload_spec), each read from its tool's source:
  random             vllm bench serve --dataset-name random (benchmarks/datasets/random.py): one
                     prefix of prefix_tokens every request starts with (--random-prefix-len), then
                     its own input and output lengths
  prefix_repetition  vllm bench serve --dataset-name prefix_repetition (prefix_repetition.py):
                     num_prefixes prefixes of prefix_len tokens, each followed by suffix_len tokens of
                     its own in (num_requests // num_prefixes) requests, shuffled
  shared_prefix      inference-perf's shared_prefix generator (datagen/synthetic/
                     shared_prefix_datagen.py) and sglang.bench_serving --dataset-name
                     generated-shared-prefix: num_groups system prompts, prompts_per_group questions
                     after each; a system prompt's length is drawn per group, a question's and its
                     output length per prompt, once. inference-perf sends prompt i mod P of the
                     shuffled prompts as request i (`order: cycle`: a prompt comes back whole every P
                     requests); SGLang sends each prompt once (`order: once`); `order: fresh`
                     sends prompt i mod P's system prompt and lengths with a question of its own
                     (token identity ("qf", stage, i): no request repeats another's question, as
                     inference-sim expands inference-perf's multi-turn rounds: fixed-length
                     inputs, sim/workload/inference_perf.go computeReasoningSpec). With multi_turn
                     (inference-perf's enable_multi_turn_chat, apis/user_session.py) request i is
                     round i div P of user i mod P, whose prompt is its conversation so far, every
                     earlier round's prompt and response, followed by its own prompt again
                     (inference-perf prepends the session's context to the prompt each round); a
                     user's rounds go one at a time (a round waits for the last one's response;
                     `SessionGate`); conversations start afresh each stage (inference-perf clears its
                     sessions between stages); a round the server rejects leaves the conversation as
                     it was
  sessions           chat sessions with think time: a session starts at each send of the stage's
                     timer, picks system prompt (session mod num_system_prompts), and runs `turns`
                     turns; turn t's prompt is the system prompt and every earlier question and
                     answer, then its own question; the next turn is sent think_time_s after the
                     answer; a rejected turn ends its session
Token identity: a system prompt is ("sys", g), a question ("q", g, j) or ("sq", session, turn), an
answer ("out", ...): requests naming the same segments at the same place share those tokens in the
prefix cache. Output lengths are what the request asks for (max_tokens; the benchmarks ignore EOS).
A request longer than the server runs whole (`admission`, infersim.serve.admission: max_model_len) is
rejected on arrival, or admitted with its output cut to fit where the engine's server does that; a
conversation then holds the output it got.
"""

from __future__ import annotations

import random
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from infersim.base.errors import InferSimError
from infersim.serve.admission import Admission
from infersim.serve.outcomes import Outcomes
from infersim.serve.profiles import stage_times
from infersim.serve.workload import LengthDist, LengthTally, Request
from infersim.serve.workload_spec import MAX_TURNS, DataSpec, StageSpec, WorkloadSpec


def _seed(seed: int, stage: int, salt: int) -> int:
    return seed * 1_000_003 + stage * 7_919 + salt


@dataclass
class _Prompts:
    """A shared-prefix generator's prompts, drawn once for the run (shuffled)."""

    group: array  # per prompt, in send order
    system: array  # system prompt length per group
    question: array  # per prompt
    output: array  # per prompt


class Traffic:
    """The requests of a workload, one stage at a time, and the sessions' follow-ups."""

    def __init__(self, spec: WorkloadSpec, seed: int, admission: Admission | None, outcomes: Outcomes) -> None:
        self.spec = spec
        self.data: DataSpec = spec.data
        self.seed = seed
        self.admission = admission
        self.outcomes = outcomes
        self.next_id = 0
        # what each length distribution's draws came to: clipped draws are said under NOTES, as a
        # --isl/--osl distribution's are
        self.tallies: dict[str, LengthTally] = {}
        self.prompts = _draw_prompts(self.data, seed, self._draw) if self.data.type == "shared_prefix" else None
        # multi-turn / sessions state, per stage
        self.context: dict[int, tuple[tuple, int]] = {}  # session -> (segments, tokens)
        self.sessions: dict[int, list] = {}  # sessions (think time): id -> [group, turns left, turn, rng]
        self.gate = SessionGate() if self.data.multi_turn else None
        self.notes: list[str] = []

    # -- a stage's scheduled requests ----------------------------------------------------------------

    def stage_requests(self, index: int, stage: StageSpec, start: float) -> Iterator[Request]:
        """The stage's requests in send order (arrival times from the stage's timer, or 0 for a
        closed-loop stage, whose sends the driver times); rejected ones are reported, not yielded."""
        self.context.clear()
        if self.gate is not None:
            self.gate.clear()
        sent = stage.sent() if stage.windowed else stage
        count = self._stage_count(sent)
        times: Iterator[float]
        if stage.concurrency is not None:
            times = _zeros(count)
        else:
            rate = stage.rate if stage.rate is not None else 1.0
            times = stage_times(self.spec.timer, count, rate, sent.duration_s, self.spec.burstiness,
                                _seed(self.seed, index, 1), self.spec.ramp)
        contents = self._contents(index, count)
        # a windowed stage counts its own int(rate x duration_s) requests, those sent after its lead-in's
        lead = int((stage.rate or 0.0) * stage.lead_s)
        counted = range(lead, lead + stage.count) if stage.windowed else range(count)
        for i, (t, req) in enumerate(zip(times, contents)):
            taken = self._taken(replace(req, arrival_s=start + t, counted=i in counted))
            if taken is not None:
                yield taken

    def _taken(self, req: Request) -> Request | None:
        """`req` as the server admits it (its output cut to fit), or None where it rejects it (reported)."""
        return req if self.admission is None else self.admission.take(req, self.outcomes)

    def _served(self, input_tokens: int, output_tokens: int) -> int:
        """Output tokens the server runs of a request (0: it rejects it), counted nowhere."""
        return output_tokens if self.admission is None else self.admission.output(input_tokens, output_tokens)

    def _stage_count(self, stage: StageSpec) -> int:
        data = self.data
        if data.type == "prefix_repetition":
            return stage.count // data.num_prefixes * data.num_prefixes
        if data.type == "shared_prefix" and data.order == "once":
            assert self.prompts is not None
            return len(self.prompts.group)
        return stage.count

    def _contents(self, stage: int, count: int) -> Iterator[Request]:
        kind = self.data.type
        if kind == "random":
            return self._random(stage, count)
        if kind == "prefix_repetition":
            return self._repetition(stage, count)
        if kind == "shared_prefix":
            return self._multi_turn(stage, count) if self.data.multi_turn else self._shared(stage, count)
        return self._session_starts(stage, count)

    def _draw(self, key: str, dist: LengthDist, rng: random.Random) -> int:
        """One length of workload.data.`key` (the same draw as dist.draw), tallied."""
        if dist.dist not in ("normal", "lognormal"):  # the only ones whose draws are clipped unasked
            return dist.draw(rng)
        tally = self.tallies.get(key)
        if tally is None:
            tally = self.tallies[key] = LengthTally(f"workload.data.{key}", dist)
        raw = dist.raw(rng)
        value = dist.clip(raw)
        tally.add(raw, value)
        return value

    def length_notes(self) -> list[str]:
        """A sentence for each length distribution whose draws are not what it asked for (clipped to
        min/max, or a tail too heavy for the draws made)."""
        return [note for note in (t.note() for t in self.tallies.values()) if note]

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _random(self, stage: int, count: int) -> Iterator[Request]:
        data = self.data
        assert data.input is not None and data.output is not None
        rng = random.Random(_seed(self.seed, stage, 2))
        prefix = ((("prefix", 0), data.prefix_tokens),) if data.prefix_tokens else ()
        for _ in range(count):
            yield Request(self._new_id(), 0.0, data.prefix_tokens + self._draw("input", data.input, rng),
                          self._draw("output", data.output, rng), segments=prefix, stage=stage)

    def _repetition(self, stage: int, count: int) -> Iterator[Request]:
        data = self.data
        assert data.output is not None
        order = array("i", (p for p in range(data.num_prefixes) for _ in range(count // data.num_prefixes)))
        rng = random.Random(_seed(self.seed, stage, 3))
        rng.shuffle(order)  # type: ignore[arg-type]
        out_rng = random.Random(_seed(self.seed, stage, 4))
        for p in order:
            yield Request(self._new_id(), 0.0, data.prefix_len + data.suffix_len, self._draw("output_len", data.output,
                                                                                              out_rng),
                          segments=((("rep", p), data.prefix_len),), stage=stage)

    def _prompt(self, index: int) -> tuple[tuple, int, int]:
        """Prompt `index` of the shuffled list: (segments, input tokens, output tokens)."""
        p = self.prompts
        assert p is not None
        g = p.group[index]
        segments = ((("sys", g), p.system[g]), (("q", g, index), p.question[index]))
        return segments, p.system[g] + p.question[index], p.output[index]

    def _shared(self, stage: int, count: int) -> Iterator[Request]:
        assert self.prompts is not None
        total = len(self.prompts.group)
        for i in range(count):
            segments, tokens, out = self._prompt(i % total)
            if self.data.order == "fresh":
                segments = (segments[0], (("qf", stage, i), segments[1][1]))
            yield Request(self._new_id(), 0.0, tokens, out, segments=_present(segments), stage=stage)

    def _multi_turn(self, stage: int, count: int) -> Iterator[Request]:
        assert self.prompts is not None
        users = len(self.prompts.group)
        for i in range(count):
            user, turn = i % users, i // users
            own, tokens, out = self._prompt(user)
            context, context_tokens = self.context.get(user, ((), 0))
            req = Request(self._new_id(), 0.0, context_tokens + tokens, out, segments=_present(context + own),
                          output_key=("out", stage, user, turn), stage=stage, session=user)
            served = self._served(req.input_tokens, out)
            if served:  # the conversation goes on with the answer the server gave
                self.context[user] = (req.segments + ((req.output_key, served),), req.input_tokens + served)
            yield req

    def _session_starts(self, stage: int, count: int) -> Iterator[Request]:
        data = self.data
        assert data.turns is not None and data.system_prompt_len is not None
        rng = random.Random(_seed(self.seed, stage, 5))
        # session j takes system prompt j mod num_system_prompts: prompts past the stage's count are never sent
        system = [self._draw("system_prompt_len", data.system_prompt_len, rng) if data.system_prompt_len.mean else 0
                  for _ in range(min(data.num_groups, count))]
        for j in range(count):
            session = self._new_id()
            group = j % data.num_groups
            turns = data.turns.draw(rng)  # a count of turns, not tokens: within MAX_TURNS, checked below
            if turns > MAX_TURNS:
                raise InferSimError(f"workload.data.turns {data.turns.describe()}: drew {turns:,} turns for a session; "
                                    f"a session runs at most {MAX_TURNS:,} (give the distribution a max)")
            self.sessions[session] = [turns, 0, random.Random(_seed(self.seed, stage, 1000 + j))]
            self.context[session] = (_present(((("sys", stage, group), system[group]),)), system[group])
            yield self._turn(stage, session)

    def _turn(self, stage: int, session: int) -> Request:
        data = self.data
        assert data.question_len is not None and data.output is not None
        state = self.sessions[session]
        turn, rng = state[1], state[2]
        question, out = self._draw("question_len", data.question_len, rng), self._draw("output_len", data.output, rng)
        context, tokens = self.context[session]
        segments = context + ((("sq", session, turn), question),)
        req = Request(self._new_id(), 0.0, tokens + question, out, segments=segments,
                      output_key=("out", session, turn), stage=stage, session=session)
        state[0] -= 1
        state[1] += 1
        served = self._served(req.input_tokens, out) or out  # a rejected turn ends its session: its context is unused
        self.context[session] = (segments + ((req.output_key, served),), tokens + question + served)
        return req

    # -- what follows a finished request ---------------------------------------------------------------

    def offer(self, req: Request) -> bool:
        """May `req` be sent now? (False: its user's last round is still running; it waits.)"""
        return self.gate is None or self.gate.offer(req)

    def done(self, req: Request, finish: float) -> list[Request]:
        """Requests that `req`'s end releases, with their send times."""
        if self.gate is not None:
            return [replace(r, arrival_s=max(r.arrival_s, finish)) for r in self.gate.done(req)]
        if self.data.type != "sessions" or req.session < 0:
            return []
        state = self.sessions.get(req.session)
        if state is None or state[0] <= 0:
            self.sessions.pop(req.session, None)
            self.context.pop(req.session, None)
            return []
        think = self.data.think_time
        wait = 0.0
        if think is not None and think.mean_s > 0:
            wait = state[2].expovariate(1.0 / think.mean_s) if think.exponential else think.mean_s
        # a session started in a stage's lead-in or tail goes on uncounted
        nxt = self._taken(replace(self._turn(req.stage, req.session), arrival_s=finish + wait, counted=req.counted))
        if nxt is None:
            self.sessions.pop(req.session, None)
            self.context.pop(req.session, None)
            return []
        return [nxt]

    def rejected(self, req: Request) -> list[Request]:
        """A request sent but never served (left waiting at a full queue): what it releases (a gated
        user's next round). Requests refused on arrival never reach the gate."""
        if self.gate is not None:
            return [replace(r, arrival_s=max(r.arrival_s, req.arrival_s)) for r in self.gate.done(req)]
        return []


class SessionGate:
    """inference-perf's user sessions: one round of a user at a time, the next one waiting (FIFO)."""

    def __init__(self) -> None:
        self.busy: set[int] = set()
        self.held: dict[int, deque[Request]] = {}
        self.released: set[int] = set()  # requests let through by `done`, sent again by the caller

    def clear(self) -> None:
        self.busy.clear()
        self.held.clear()
        self.released.clear()

    def offer(self, req: Request) -> bool:
        if req.session < 0:
            return True
        if req.id in self.released:
            self.released.discard(req.id)
            return True
        if req.session in self.busy:
            self.held.setdefault(req.session, deque()).append(req)
            return False
        self.busy.add(req.session)
        return True

    def done(self, req: Request) -> list[Request]:
        queue = self.held.get(req.session)
        if queue:
            nxt = queue.popleft()
            if not queue:
                del self.held[req.session]
            self.released.add(nxt.id)
            return [nxt]
        self.busy.discard(req.session)
        return []


def _zeros(count: int) -> Iterator[float]:
    for _ in range(count):
        yield 0.0


def _present(segments: tuple) -> tuple:
    """Segments without the empty ones (a system prompt of 0 tokens)."""
    return tuple(s for s in segments if s[1] > 0)


def _draw_prompts(data: DataSpec, seed: int, draw: Callable[[str, LengthDist, random.Random], int]) -> _Prompts:
    """The shared-prefix generator's prompts: lengths drawn once per group (system prompt) and per
    prompt (question, output), in a seeded shuffled order, as inference-perf draws them."""
    assert data.system_prompt_len is not None and data.question_len is not None and data.output is not None
    rng = random.Random(_seed(seed, 0, 6))
    system_len = data.system_prompt_len
    system = array("q", (0 if system_len.dist == "fixed" and system_len.mean == 0 else
                         draw("system_prompt_len", system_len, rng) for _ in range(data.num_groups)))
    group, question, output = array("q"), array("q"), array("q")
    for g in range(data.num_groups):
        for _ in range(data.prompts_per_group):
            group.append(g)
            question.append(draw("question_len", data.question_len, rng))
            output.append(draw("output_len", data.output, rng))
    order = list(range(len(group)))
    rng.shuffle(order)
    return _Prompts(array("q", (group[i] for i in order)), system, array("q", (question[i] for i in order)),
                    array("q", (output[i] for i in order)))

