"""Launch plans of a plain run, a serving run and a sweep's chosen rows.

The parser data is chosen by the engine card's framework and version (`infersim.cards.engine_parser`), the
speller by the framework; a framework without a server (HF transformers) or a layout the engine
cannot express is one error naming why.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infersim.cards.deployment import Deployment
from infersim.cards.engine import EngineCard
from infersim.cards.model import ModelCard
from infersim.run.config import RunConfig
from infersim.base.errors import InferSimError
from infersim.launch.assumed import Assumed, assumed_for_batch, assumed_for_pool
from infersim.cards.engine_parser import parser_for
from infersim.launch.plan import LaunchPlan, PlanParts

if TYPE_CHECKING:
    from infersim.run.simulate import SimulationResult

SPELLERS = {"vllm": "infersim.launch.vllm", "sglang": "infersim.launch.sglang", "trtllm": "infersim.launch.trtllm"}

#: ports of a PD-disaggregated deployment: prefill servers, decode servers, the router (free choices)
PD_PORTS = {"vllm": (8100, 8200, 8000), "sglang": (30000, 30001, 8000), "trtllm": (8001, 8002, 8000)}


def _speller(framework: str, engine: str = "") -> Any:
    if framework not in SPELLERS:
        who = f"engine {engine} (framework {framework})" if engine and engine != framework else f"engine {framework}"
        raise InferSimError(f"--emit-launch: {who} has no server to launch "
                            f"(launch commands exist for {', '.join(SPELLERS)})")
    return importlib.import_module(SPELLERS[framework])


def layout_check(engine: EngineCard) -> Callable[[Deployment, ModelCard], object] | None:
    """The engine's own rule of what its flags can express, on a completed deployment: the speller's
    check_layout, which every command it spells passes first (it raises a LaunchRefusal). None where the
    engine has no server to launch, or no parser data at or below its version (no command can be spelled)."""
    if engine.framework not in SPELLERS:
        return None
    try:
        data = parser_for(engine.framework, engine.version).data
    except InferSimError:
        return None
    return functools.partial(_speller(engine.framework).check_layout, data=data)


def _plan(servers: list[Assumed], label: str = "") -> LaunchPlan:
    engine = servers[0].engine
    speller = _speller(engine.framework, engine.name)
    chosen = parser_for(engine.framework, engine.version)
    parts = PlanParts()
    if len(servers) == 1:
        speller.spell(servers[0], chosen.data, parts)
        if servers[0].instances > 1:
            parts.note(f"{servers[0].instances} copies of the server behind a load balancer (the simulation routed "
                       "requests round-robin or to the least loaded)")
    else:
        prefill, decode = servers
        p_port, d_port, router_port = PD_PORTS[engine.framework]
        speller.spell(prefill, chosen.data, parts, p_port)
        speller.spell(decode, chosen.data, parts, d_port)
        speller.spell_router([f"http://$PREFILL_{i}_IP:{p_port}" for i in range(prefill.instances)],
                             [f"http://$DECODE_{i}_IP:{d_port}" for i in range(decode.instances)],
                             chosen.data, parts, router_port)
        parts.note("PREFILL_i_IP, DECODE_i_IP: the addresses of the prefill and decode servers (node 0 of each); ports "
                   f"{p_port}, {d_port} and the router's {router_port} are free choices")
    return LaunchPlan(f"{engine.name} {engine.version}", f"{chosen.note} (engines/launch/{chosen.path.name})",
                      tuple(parts.commands), tuple(parts.settings), tuple(parts.notes), label)


def plan_for_run(result: SimulationResult) -> LaunchPlan:
    """The command of a plain run: its engine card's settings, the simulated decode batch as the cap."""
    from infersim.run.simulate import decode_batch

    batch = decode_batch(result.config, result.memory)
    lookahead = result.speculative.lookahead if result.speculative is not None else 0
    return _plan([assumed_for_batch(result.config, batch, result.memory, lookahead)])


def plan_for_config(config: RunConfig, batch_per_gpu: int, label: str = "") -> LaunchPlan:
    """The command of a sweep row: the row's deployment and decode batch."""
    return _plan([assumed_for_batch(config, batch_per_gpu)], label)


def plan_for_pools(pools: list[Any], max_model_len: int | None = None) -> LaunchPlan:
    """The commands of a serving run's pools (infersim.serve.simulate.Pool): one server, replicas of it,
    or a prefill and a decode pool and the router between them. `max_model_len`: the serving run's
    (every server admits what the simulation admitted); None leaves it to the engine, whose default is
    the model's context, as the simulation's is."""
    servers = [assumed_for_pool(p.config, p.settings, "server" if p.name == "colocated" else p.name, p.count,
                                max_model_len or 0) for p in pools]
    return _plan(servers)
