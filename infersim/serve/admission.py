"""What a server does with an arriving request by its length: the engine card's context rule
(infersim.cards.engine_scheduler.ContextLimit) at the server's context length.

The context length is a given max_model_len plus the tokens the engine keeps free (the value
--emit-launch gives the engine's context flag, so that a request of max_model_len tokens runs whole),
or, where none is given, the model's max_position_embeddings (the engines' default). At it the
engine refuses a request (rejected on arrival), cuts its output to what fits (vLLM 0.33: admitted
with fewer output tokens, counted for the run's note), or takes it as asked. An engine that runs
past the model's context (HF transformers) is held to a given max_model_len as a server that
refuses longer requests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infersim.base.texttable import counted
from infersim.cards.engine_scheduler import ContextLimit
from infersim.run.config import RunConfig
from infersim.serve.outcomes import Outcomes
from infersim.serve.workload import Request

#: the rule a server holds where it refuses every request longer than its limit (a given max_model_len
#: on an engine that runs past the context; the KV pool's longest request)
REFUSE_LONGER = ContextLimit(beyond="refuse")


@dataclass(frozen=True)
class Admission:
    """The server's context length and the engine's rule at it."""

    context: int  # tokens: the engine's context length (its context flag's value)
    rule: ContextLimit
    admits: str  # what it takes, for the requests it rejects: 'longer (prompt + output) than ...'

    def output(self, input_tokens: int, output_tokens: int) -> int:
        """Output tokens the server runs of a request (0: it refuses it)."""
        return self.rule.output_run(self.context, input_tokens, output_tokens)

    def longest(self) -> int:
        """The most tokens (prompt + output) of a request the server runs whole."""
        return self.context - self.rule.kept_free()

    def take(self, req: Request, outcomes: Outcomes) -> Request | None:
        """`req` as the server runs it (a copy with fewer output tokens where it cuts them, counted in
        `outcomes`), or None where it refuses it (rejected in `outcomes`)."""
        served = self.output(req.input_tokens, req.output_tokens)
        if not served:
            outcomes.reject(req)
            return None
        if served < req.output_tokens:
            outcomes.shorten(req.output_tokens - served)
            return replace(req, output_tokens=served)
        return req


def server_admission(config: RunConfig, max_model_len: int | None) -> Admission | None:
    """The server's admission by length: at a given max_model_len (plus what the engine keeps free),
    else at the model's context where the engine limits requests to it (None: no limit)."""
    rule, model, engine = config.engine.context_limit, config.model, config.engine.name
    if max_model_len:
        if rule.beyond == "run":
            return Admission(max_model_len, REFUSE_LONGER, f"max_model_len {max_model_len:,}")
        context = rule.server_context(max_model_len)
        return Admission(context, rule, f"max_model_len {max_model_len:,}" + _prompt_clause(rule, context))
    context = model.max_position_embeddings
    if not context or rule.beyond == "run":
        return None
    return Admission(context, rule, f"model {model.name}'s context of {context:,} tokens (max_position_embeddings)"
                                    f"{kept_free_clause(rule, engine)}, the max_model_len {engine} defaults to"
                                    + _prompt_clause(rule, context))


def kept_free_clause(rule: ContextLimit, engine: str) -> str:
    """' less the N tokens ENGINE keeps free' where the engine refuses a request short of the context
    (context_limit.reserved_tokens), else ''."""
    tokens = rule.reserved_tokens
    return f" less the {tokens} token{'s' if tokens > 1 else ''} {engine} keeps free" if tokens else ""


def pool_admission(longest: int) -> Admission:
    """A server whose context fits its KV pool: requests longer than the `longest` tokens one
    request may hold of it are refused."""
    return Admission(longest, REFUSE_LONGER, f"the {longest:,} tokens one request may hold of the KV pool")


def _prompt_clause(rule: ContextLimit, context: int) -> str:
    """The prompts the engine refuses short of the context, where it refuses some."""
    return f", or with a prompt of {context - rule.prompt_margin:,} tokens or more" if rule.prompt_margin else ""


def shortened_note(config: RunConfig, admission: Admission, outcomes: Outcomes) -> list[str]:
    """The requests the server admitted with their output cut to fit its context, and the output
    tokens cut in all ([] where none was)."""
    count = outcomes.shortened
    if not count:
        return []
    rule, engine = admission.rule, config.engine
    kept = f" and the {rule.output_margin} tokens it keeps free" if rule.output_margin else ""
    one = count == 1
    return [f"{counted(count, 'request')} longer (prompt + output) than {engine.name} {engine.version} runs "
            f"whole at a context of {admission.context:,} tokens ({admission.admits}) {'was' if one else 'were'} "
            f"admitted with {'its' if one else 'their'} output cut to the context less the prompt{kept}: "
            f"{outcomes.shortened_tokens:,} output token{'' if outcomes.shortened_tokens == 1 else 's'} fewer in all "
            f"(engine card context_limit.beyond {rule.beyond})"]
