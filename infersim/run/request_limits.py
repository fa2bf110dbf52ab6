"""What an engine's server does with one request against the model's context and its KV pool: the
output it runs of a request longer than it runs whole (engine card context_limit: refused, cut, or
run past the context), what is said of it, and the flag that raises its running-request cap."""

from __future__ import annotations

from dataclasses import replace

from infersim.base.errors import InferSimError
from infersim.cards.engine import EngineCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.run.memory import MemoryResult


def larger_cap(engine: EngineCard) -> str:
    """What a server needs to run a decode batch above its engine's default running-request cap: the
    flag that raises it, as the engine card names it (scheduler.running_cap_flag), and whether
    --emit-launch can set it; or, where the card names none, that no flag is known (the run's warning,
    a sweep's note)."""
    flag = engine.scheduler.running_cap_flag
    if flag:
        return f"only with a larger cap ({flag}{_launch_clause(engine, flag)})"
    return f"only with a larger cap, and engine card {engine.name} names no flag that sets one (scheduler.running_cap_flag)"


def _launch_clause(engine: EngineCard, flag: str) -> str:
    """Whether --emit-launch sets the card's cap flag: only where the engine's parser data has it as a
    whole-number flag (nothing is said where there is no parser data: --emit-launch says why)."""
    from infersim.cards.engine_parser import parser_for  # a run without this warning needs no parser data

    try:
        chosen = parser_for(engine.framework, engine.version)
    except InferSimError:
        return ""
    lacks = chosen.data.server.lacks_whole_number(flag)
    if lacks:
        return f"; --emit-launch cannot set it: {chosen.data.title}'s parser has {lacks}"
    return "; --emit-launch sets it"


def runs_past_context(engine: str, requests: int = 1) -> str:
    """What is said of `requests` requests longer than the model's context that `engine` runs anyway
    (the main run's warning, serve's note)."""
    return f"{engine} runs {'it' if requests == 1 else 'them'}, but the model was not trained on positions that far"


def context_warnings(config: RunConfig) -> list[str]:
    """What the run's request length against the model's context is worth a word about, where it is
    not a refusal (fit_problems) or a shortened output (within_context): an engine that runs it
    anyway, or a model card that states none."""
    rule = config.engine.context_limit
    beyond = beyond_context(config)
    if beyond and rule.beyond == "run":
        return [f"{beyond}: {runs_past_context(config.engine.name)}"]
    if not config.model.max_position_embeddings and rule.beyond != "run":
        return [f"model card {config.model.name} states no context length (max_position_embeddings): the request "
                f"length is not checked against it ({config.engine.name} takes its context from the model's config, "
                "and a default of its own where the config states none)"]
    return []


def beyond_context(config: RunConfig) -> str:
    """What is wrong when one request (prompt + output) is longer than the model's context length;
    empty when it is not, or the model card states none."""
    return request_beyond_context(config.model, config.engine, config.workload.isl, config.workload.osl)


def request_beyond_context(model: ModelCard, engine: EngineCard, isl: int, osl: int) -> str:
    """beyond_context of a request of `isl` + `osl` tokens on `engine` serving `model`: longer than
    the context, filling it (the engine keeps tokens of it free), or with a prompt the engine finds
    too close to it; empty where the engine's server runs the request whole."""
    context, limit = isl + osl, model.max_position_embeddings
    if not limit:
        return ""
    if context > limit:
        what = "is longer than"
    elif context > engine.longest_request(limit):
        what = "fills"
    elif engine.context_limit.refusal(limit, isl, osl):
        what = f"has a prompt {limit - isl:,} tokens short of"
    else:
        return ""
    return (f"a request of {context:,} tokens (ISL {isl:,} + OSL {osl:,}) {what} model {model.name}'s context of "
            f"{limit:,} tokens (max_position_embeddings)")


def served_osl(model: ModelCard, engine: EngineCard, isl: int, osl: int) -> tuple[int, str]:
    """(output tokens `engine`'s server runs of a request of `isl` + `osl` tokens at the model's
    context, what is said of it): (osl, "") where it runs the request as asked (or the engine runs
    past the context: context_warnings); (0, why) where it refuses it; (n, what) where it cuts the
    output to n tokens (engine card context_limit)."""
    what = request_beyond_context(model, engine, isl, osl)
    rule, limit = engine.context_limit, model.max_position_embeddings
    if not what or rule.beyond == "run":
        return osl, ""
    served = rule.output_run(limit, isl, osl)
    if not served:
        return 0, (f"{what}: {engine.name} {engine.version} refuses such requests (refused: {rule.refusal(limit, isl, osl)}, at the "
                   "context its server defaults to, the model's)")
    kept = f", {rule.output_margin} tokens short of it" if rule.output_margin else ""
    return served, (f"{what}: {engine.name} {engine.version} cuts its output to {served:,} tokens, what fits (prompt + "
                    f"output up to the context its server defaults to, the model's{kept}; engine card "
                    f"context_limit.beyond {rule.beyond})")


def within_context(config: RunConfig) -> tuple[RunConfig, str]:
    """The run as the engine's server takes it: its workload's OSL cut to what the engine runs where
    the request is longer than it runs whole (a warning says so), else the run as given (a refused
    request is a fit problem)."""
    workload = config.workload
    served, said = served_osl(config.model, config.engine, workload.isl, workload.osl)
    if not served or served == workload.osl:
        return config, ""
    return (replace(config, workload=replace(workload, osl=served)),
            f"{said}: OSL {served:,} simulated, not the {workload.osl:,} asked for")


def kv_pool_said(config: RunConfig, memory: MemoryResult) -> str:
    """'; ENGINE ...' what the engine's server does with the run's request where its scheduler holds a
    request to its KV pool (engine card context_limit.kv_pool) and the request is longer than the
    pool: it cuts the output to what the pool holds, or refuses the prompt; '' elsewhere."""
    held = _held_by_pool(config, memory)
    if held is None:
        return ""
    name, (pool, page, output) = f"{config.engine.name} {config.engine.version}", held
    if not output:
        return f"; {name} rejects it on arrival: {_pool_refuses(config, pool, page)}"
    return (f"; {name} does not refuse it: its scheduler holds a request to its KV pool of {pool:,} tokens and runs it "
            f"with its output cut to {output:,} tokens ({POOL_CARD}; --osl {output} simulates that)")


#: the engine card field kv_pool_said and pool_problem name
POOL_CARD = "engine card context_limit.kv_pool"


def pool_problem(config: RunConfig, memory: MemoryResult) -> list[str]:
    """A request that fits the KV cache, but whose output the engine's scheduler cuts to its KV pool
    or whose prompt it refuses for it (kv_pool_said of a request that fits): the pool's margins and
    whole pages hold less than the cache; [] where the pool takes the request as asked."""
    held = _held_by_pool(config, memory)
    if held is None:
        return []
    workload, (pool, page, output) = config.workload, held
    request = f"a request of {workload.isl + workload.osl:,} tokens (ISL {workload.isl:,} + OSL {workload.osl:,})"
    name = f"{config.engine.name} {config.engine.version}"
    if not output:
        return [f"{request} fits the KV cache, but {name} rejects it on arrival: {_pool_refuses(config, pool, page)}; "
                "fix: a shorter prompt (--isl), or a larger KV pool (an fp8 KV cache: --kv-cache-dtype fp8; more GPUs)"]
    return [f"{request} fits the KV cache, but {name} runs it with its output cut to {output:,} tokens: its scheduler "
            f"holds a request to its KV pool of {pool:,} tokens ({POOL_CARD}; --osl {output} simulates that); fix: "
            f"--osl {output}, or a larger KV pool (an fp8 KV cache: --kv-cache-dtype fp8; more GPUs)"]


def _held_by_pool(config: RunConfig, memory: MemoryResult) -> tuple[int, int, int] | None:
    """(tokens of the KV pool, its page, the output tokens its scheduler runs of the run's request) where
    the engine holds a request to its KV pool (context_limit.kv_pool) and that changes the request
    (0: it refuses it); None elsewhere."""
    engine, workload = config.engine, config.workload
    rule = engine.context_limit
    if rule.kv_pool is None:
        return None
    page = engine.page_size(config.hardware, config.model.is_mla)
    pool = memory.pool_tokens(page)
    served = served_osl(config.model, engine, workload.isl, workload.osl)[0]
    if not (pool and served):  # no pool in tokens, none left (the weights' problem), or refused by the context
        return None
    by_pool = rule.pool_output(pool, page, workload.isl, served)
    return None if by_pool == served else (pool, page, by_pool)


def _pool_refuses(config: RunConfig, pool: int, page: int) -> str:
    """Why the engine's scheduler refuses the run's prompt for its KV pool, with the card field."""
    limit = config.engine.context_limit.pool_prompt_limit(pool, page)
    prompts = f"no prompt of {limit:,} tokens or more" if limit > 1 else "no prompt at all"
    return f"its scheduler holds a request to its KV pool of {pool:,} tokens, which takes {prompts} ({POOL_CARD})"
