"""What a server does with an arriving request by its length: the engine card's context rule
(infersim.cards.engine_scheduler.ContextLimit) at the server's context length.

The context length is a given max_model_len plus the tokens the engine keeps free (the value
--emit-launch gives the engine's context flag, so that a request of max_model_len tokens runs whole),
or, where none is given, the model's max_position_embeddings (the engines' default). At it the
engine refuses a request (rejected on arrival), cuts its output to what fits (vLLM 0.33: admitted
with fewer output tokens, counted for the run's note), or takes it as asked. An engine that runs
past the model's context (HF transformers) is held to a given max_model_len as a server that
refuses longer requests. An engine whose scheduler holds a request to its KV pool too (SGLang:
context_limit.kv_pool) refuses or cuts it by one scheduler's pool after the context's rule
(`with_kv_pool`); those are counted apart from the context's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from infersim.base.texttable import counted
from infersim.cards.engine_scheduler import ContextLimit
from infersim.run.config import RunConfig
from infersim.serve.outcomes import Outcomes
from infersim.serve.settings import SchedulerSettings
from infersim.serve.workload import Request

#: the rule a server holds where it refuses every request longer than its limit (a given max_model_len
#: on an engine that runs past the context; the KV pool's longest request)
REFUSE_LONGER = ContextLimit(beyond="refuse")


@dataclass(frozen=True)
class Admission:
    """The server's context length and the engine's rule at it, with the KV pool its scheduler holds
    a request to (context_limit.kv_pool)."""

    context: int  # tokens: the engine's context length (its context flag's value; 0: none stated)
    rule: ContextLimit
    admits: str  # what it takes, for the requests it rejects: 'longer (prompt + output) than ...'
    pool: int | None = None  # tokens of one scheduler's KV pool, where the engine holds a request to it (None: it does not)
    page: int = 1  # the pool's page, tokens
    by_context: str = ""  # `admits` of the context alone, where the pool's prompt limit is said in it too

    def output(self, input_tokens: int, output_tokens: int) -> int:
        """Output tokens the server runs of a request (0: it refuses it)."""
        return self._served(input_tokens, output_tokens)[1]

    def _served(self, input_tokens: int, output_tokens: int) -> tuple[int, int]:
        """(output tokens the context leaves the request, of which the KV pool leaves it); 0: refused."""
        by_context = self.rule.output_run(self.context, input_tokens, output_tokens)
        if not by_context or self.pool is None or input_tokens + by_context <= self._pool_runs_whole:
            return by_context, by_context  # a request the pool runs whole: every request of a run, mostly
        return by_context, self.rule.pool_output(self.pool, self.page, input_tokens, by_context)

    @cached_property
    def _pool_runs_whole(self) -> int:
        """ContextLimit.pool_runs_whole at this admission's pool (which is not None where it is asked)."""
        assert self.pool is not None
        return self.rule.pool_runs_whole(self.pool, self.page)

    def longest(self) -> int:
        """The most tokens (prompt + output) of a request the server runs whole."""
        return self.context - self.rule.kept_free()

    def take(self, req: Request, outcomes: Outcomes) -> Request | None:
        """`req` as the server runs it (a copy with fewer output tokens where it cuts them, counted in
        `outcomes`), or None where it refuses it (rejected in `outcomes`)."""
        by_context, served = self._served(req.input_tokens, req.output_tokens)
        if not served:
            outcomes.reject(req, for_pool=by_context > 0)
            return None
        if by_context < req.output_tokens:
            outcomes.shorten(req.output_tokens - by_context)
        if served < by_context:
            outcomes.shorten(by_context - served, for_pool=True)
        return replace(req, output_tokens=served) if served < req.output_tokens else req

    def pool_binds(self) -> bool:
        """Does the KV pool refuse prompts the context takes (a pool shorter than the context)?"""
        if self.pool is None:
            return False
        return not self.context or self.rule.pool_prompt_limit(self.pool, self.page) < self.context - self.rule.prompt_margin

    def pool_cut_said(self) -> str:
        """What the scheduler cuts an output to by its KV pool: 'the pool less the prompt and the 2
        tokens it keeps free'."""
        rule = self.rule
        assert rule.kv_pool is not None
        fit = rule.kv_pool.empty_pool_fit
        kept = rule.output_margin if rule.kv_pool.margins else 0
        if fit is not None and self.page == 1:
            kept = max(kept, fit.pages_free + fit.tokens_free)
        elif fit is not None:
            free = " and ".join(counted(n, what) for n, what in ((fit.pages_free, "more page"),
                                                                  (fit.tokens_free, "token")) if n)
            return (f"what the empty pool holds beside the prompt: the pool less the prompt in whole pages of "
                    f"{self.page} tokens" + (f", {free}" if free else ""))
        return "the pool less the prompt" + (f" and the {counted(kept, 'token')} it keeps free" if kept else "")


def server_admission(config: RunConfig, max_model_len: int | None) -> Admission | None:
    """The server's admission by length: at a given max_model_len (plus what the engine keeps free),
    else at the model's context where the engine limits requests to it (None: no limit)."""
    rule, model, engine = config.engine.context_limit, config.model, config.engine.name
    if max_model_len:
        if rule.beyond == "run":
            return Admission(max_model_len, REFUSE_LONGER, f"max_model_len {max_model_len:,}")
        context = rule.server_context(max_model_len)
        return Admission(context, rule, f"max_model_len {max_model_len:,}" + prompt_clause(rule, context))
    context = model.max_position_embeddings
    if not context or rule.beyond == "run":
        return None
    return Admission(context, rule, f"model {model.name}'s context of {context:,} tokens (max_position_embeddings)"
                                    f"{kept_free_clause(rule, engine)}, the max_model_len {engine} defaults to"
                                    + prompt_clause(rule, context))


def kept_free_clause(rule: ContextLimit, engine: str) -> str:
    """' less the N tokens ENGINE keeps free' where the engine refuses a request short of the context
    (context_limit.reserved_tokens), else ''."""
    tokens = rule.reserved_tokens
    return f" less the {counted(tokens, 'token')} {engine} keeps free" if tokens else ""


def pool_admission(longest: int) -> Admission:
    """A server whose context fits its KV pool: requests longer than the `longest` tokens one
    request may hold of it are refused."""
    return Admission(longest, REFUSE_LONGER, f"the {longest:,} tokens one request may hold of the KV pool")


def with_kv_pool(admission: Admission | None, config: RunConfig, pools: list[SchedulerSettings]) -> Admission | None:
    """The admission with the KV pool the engine's scheduler holds a request to (engine card
    context_limit.kv_pool; unchanged where it names none): one scheduler's pool, an attention-DP
    rank's, of the smallest of `pools` (a request disaggregated passes both a prefill and a decode
    server, each holding it to its own pool)."""
    rule = config.engine.context_limit
    if rule.kv_pool is None or not pools:
        return admission
    # a rank's share of the instance's pool (0: it holds nothing, and refuses every request)
    pool, page = min((s.rank_pool_tokens, s.page_size) for s in pools)
    if admission is None:
        admission = Admission(0, rule, "")
    pooled = replace(admission, pool=pool, page=page)
    if not pooled.pool_binds():
        return pooled
    refused = f"{prompts_from(rule.pool_prompt_limit(pool, page))} (its KV pool holds {counted(pool, 'token')})"
    # the pool's prompt limit is the lower: it stands for the context's
    context = admission.admits.removesuffix(prompt_clause(rule, admission.context)) if admission.context else ""
    return replace(pooled, admits=f"{context}, or with {refused}" if context else refused, by_context=admission.admits)


def prompts_from(limit: int) -> str:
    """'a prompt of LIMIT tokens or more', or 'any prompt' where every prompt (of a token or more) is."""
    return f"a prompt of {limit:,} tokens or more" if limit > 1 else "any prompt"


def prompt_clause(rule: ContextLimit, context: int) -> str:
    """The prompts the engine refuses short of the context, where it refuses some."""
    return f", or with a prompt of {context - rule.prompt_margin:,} tokens or more" if rule.prompt_margin else ""


def shortened_note(config: RunConfig, admission: Admission, outcomes: Outcomes) -> list[str]:
    """The requests the server admitted with their output cut to fit its context, and the output
    tokens cut in all ([] where none was)."""
    count = outcomes.shortened
    if not count:
        return []
    rule, engine = admission.rule, config.engine
    kept = f" and the {counted(rule.output_margin, 'token')} it keeps free" if rule.output_margin else ""
    one = count == 1
    return [f"{counted(count, 'request')} longer (prompt + output) than {engine.name} {engine.version} runs "
            f"whole at a context of {admission.context:,} tokens ({admission.by_context or admission.admits}) "
            f"{'was' if one else 'were'} "
            f"admitted with {'its' if one else 'their'} output cut to the context less the prompt{kept}: "
            f"{counted(outcomes.shortened_tokens, 'output token')} fewer in all "
            f"(engine card context_limit.beyond {rule.beyond})"]


def pool_note(config: RunConfig, admission: Admission | None, outcomes: Outcomes) -> list[str]:
    """The requests the engine's scheduler refused, or admitted with their output cut, for its KV
    pool (context_limit.kv_pool), and the output tokens cut ([] where none was)."""
    refused, cut = outcomes.pool_rejected, outcomes.pool_shortened
    if admission is None or admission.pool is None or not (refused or cut):
        return []
    engine, pool, tokens = config.engine, admission.pool, outcomes.pool_shortened_tokens
    fewer = f", fewer than its context of {admission.context:,} tokens" if pool < admission.context else ""
    parts = [_pool_refused(engine.name, admission, refused)] if refused else []
    if cut:
        one = cut == 1
        parts.append(f"{counted(cut, 'request')} {'was' if one else 'were'} admitted with {'its' if one else 'their'} "
                     f"output cut to {admission.pool_cut_said()}: {counted(tokens, 'output token')} fewer in all")
    return [f"{engine.name} {engine.version} holds a request to its KV pool of {counted(pool, 'token')} per scheduler"
            f"{fewer}: " + ", and ".join(parts) + " (engine card context_limit.kv_pool)"]


def _pool_refused(engine: str, admission: Admission, refused: int) -> str:
    """pool_note's part of the `refused` requests: '2 requests with a prompt of 994 tokens or more were
    rejected on arrival', with the prompts below it the scheduler runs with no output token."""
    rule, pool = admission.rule, admission.pool
    assert rule.kv_pool is not None and pool is not None
    limit = rule.pool_prompt_limit(pool, admission.page)
    aborted = pool - rule.prompt_margin  # with margins, the scheduler aborts a prompt this long or longer
    one = refused == 1
    # a prompt the scheduler does not abort but leaves no output token runs alone, and no token comes back
    if not rule.kv_pool.margins:
        alone = f" ({engine} runs {'it' if one else 'them'} with no output token: no answer comes back)"
    elif aborted > limit:
        alone = f" (one of fewer than {aborted:,} tokens {engine} runs with no output token: no answer comes back)"
    else:
        alone = ""
    which = f" with {prompts_from(limit)}" if limit > 1 else ""
    every = ", as every prompt is" if limit <= 1 else ""
    return f"{counted(refused, 'request')}{which} {'was' if one else 'were'} rejected on arrival{every}{alone}"
