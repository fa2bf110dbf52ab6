"""--emit-launch: the engine command that realises a simulated deployment.

Every emitted argument is parsed back against the engine version's parser data (engines/launch/)
with its kind and choices, and every fact the engine card made the simulation assume (memory share,
token budget, running cap, CUDA-graph sizes, page size, prefix cache, overlap scheduler) is computed
here from the card and found either set on the command to that value or left at a parser default
equal to it. The layouts each engine cannot express are refused with the reason.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from infersim.cards.engine_scheduler import tier_value
from infersim.cli.main import main
from infersim.run.config import load_run_config
from infersim.base.errors import ConfigError, InferSimError
from infersim.launch.build import plan_for_run
from infersim.cards.engine_parser import (
    ParserData,
    Program,
    known_versions,
    load_parser_data,
    parser_for,
)
from infersim.launch.plan import LaunchPlan
from infersim.run.flags import RunFlags
from infersim.run.simulate import decode_batch, simulate

DATA_DIR = Path(__file__).resolve().parent.parent / "engines" / "launch"
#: the tests on vLLM and an H200 run in one pytest-xdist worker: its kernel tables (~6 CPU-s to
#: index, then read from the session's cache) are indexed once, not by two workers at the same moment
ON_H200_VLLM = pytest.mark.xdist_group("launch-h200-vllm")


def run_config(engine: str, version: str | None = None, **flags: Any):
    overrides = [f'engine.version="{version}"'] if version else []
    defaults = {"isl": 2000, "osl": 500}
    return load_run_config(None, overrides, None, RunFlags(engine=engine, **{**defaults, **flags}))


def launch(engine: str, version: str | None = None, **flags: Any) -> tuple[LaunchPlan, Any]:
    result = simulate(run_config(engine, version, **flags))
    return plan_for_run(result), result


# ---------------------------------------------------------------------------------------------
# An argv read back with the parser data alone (independent of the code that wrote it)


def parse(program: Program, argv: tuple[str, ...]) -> dict[str, Any]:
    """flag -> value of a command line, every flag looked up in the parser data and its value checked
    against the flag's kind; fails on anything the parser would not take."""
    words = list(argv[len(program.program):])
    values: dict[str, Any] = {}
    if not program.model_argument:
        values["MODEL"] = words.pop(0)
    while words:
        word = words.pop(0)
        assert word.startswith("--"), f"stray word {word!r} in {argv}"
        flag = program.find(word)
        if flag is None and word.startswith("--no-"):
            flag = program.find("--" + word[5:])
            assert flag is not None and flag.kind == "toggle", f"{word}: no such toggle"
            values[flag.name] = False
            continue
        assert flag is not None, f"{word} is not in {program.package}'s parser data"
        take = []
        while words and not (words[0].startswith("--")):
            take.append(words.pop(0))
        values[flag.name] = _value(flag, take, argv)
    return values


def _value(flag: Any, take: list[str], argv: Any) -> Any:
    kind = flag.kind
    if kind in ("switch", "toggle"):
        assert not take, f"{flag.name} takes no value: {take}"
        return True
    if kind in ("int-list",):
        assert take, f"{flag.name} needs values"
        return [int(v) for v in take]
    if kind == "url-list":
        assert take
        return take
    assert len(take) == 1, f"{flag.name} takes one value, got {take} in {argv}"
    text = take[0]
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "choice":
        assert text in flag.choices, f"{flag.name} {text}: not one of {flag.choices}"
        return text
    if kind == "json":
        obj = json.loads(text)
        assert set(obj) <= set(flag.json_keys), f"{flag.name}: keys {set(obj) - set(flag.json_keys)} unknown"
        return obj
    return text


def emitted(plan: LaunchPlan, data: ParserData) -> dict[str, Any]:
    """Every argument of the plan's first server command: flags, environment, options-file keys."""
    command = next(c for c in plan.commands if c.role != "router")
    values = parse(data.server, command.argv)
    for name, value in command.env:
        flag = data.server.find(name)
        assert flag is not None and flag in data.server.environment, name
        assert flag.kind != "choice" or value in flag.choices
        values[name] = value
    for file in command.files:
        def walk(node: dict, prefix: str = "") -> None:
            for key, value in node.items():
                name = f"{prefix}{key}"
                if isinstance(value, dict):
                    walk(value, name + ".")
                else:
                    assert data.server.find(name) in data.server.config_file, f"{name} not an options-file key"
                    values[name] = value
        walk(yaml.safe_load(file.text))
    return values


def expected_graph_sizes(config: Any, cap: int) -> list[int]:
    engine, hbm = config.engine, config.hardware.peak.hbm_bytes
    limit = engine.graph_max_batch(hbm, config.deployment.gpus_per_stage)
    sizes = sorted({s for r in engine.overheads.cuda_graph_batch_sizes for s in range(r.start, min(r.stop, limit) + 1, r.step)})
    first = next((s for s in sizes if s >= cap), None)
    return [s for s in sizes if first is None or s <= first]


def card_facts(result: Any) -> dict[str, Any]:
    """argument -> the value the engine card (and the simulated batch) made the simulation assume."""
    config = result.config
    engine, hw, dep = config.engine, config.hardware, config.deployment
    hbm = hw.peak.hbm_bytes
    tier = int(tier_value(engine.scheduler.chunked_prefill_tokens, hbm))
    cap = decode_batch(config, result.memory) * dep.attention.tp * dep.pp
    sizes = expected_graph_sizes(config, cap)
    overlap = engine.overheads.overlap_scheduler
    if engine.framework == "vllm":
        graphs = "--cuda-graph-sizes" if config.engine.version.startswith("0.11") else "--cudagraph-capture-sizes"
        return {"--gpu-memory-utilization": engine.memory.gpu_memory_utilization, "--max-num-batched-tokens": tier,
                "--max-num-seqs": cap, "--block-size": engine.scheduler.page_size,
                "--enable-prefix-caching": engine.scheduler.prefix_cache, "--async-scheduling": overlap,
                graphs: sizes}
    if engine.framework == "sglang":
        dp = dep.attention.dp
        static = (hbm - result.memory.reserved_bytes) / hbm
        return {"--chunked-prefill-size": tier // dp * dp, "--mem-fraction-static": round(static, 3),
                "--max-running-requests": cap * dp, "--page-size": engine.scheduler.page_size,
                "--disable-radix-cache": not engine.scheduler.prefix_cache, "--disable-overlap-schedule": not overlap,
                "--enable-mixed-chunk": engine.scheduler.mixed_batches, "--cuda-graph-max-bs": sizes[-1],
                "--cuda-graph-bs": sizes}
    return {"--kv_cache_free_gpu_memory_fraction": engine.memory.kv_fraction_of_free, "--max_num_tokens": tier,
            "--max_batch_size": cap, "kv_cache_config.tokens_per_block": engine.scheduler.page_size,
            "kv_cache_config.enable_block_reuse": engine.scheduler.prefix_cache,
            "disable_overlap_scheduler": not overlap, "cuda_graph_config.batch_sizes": sizes,
            "cuda_graph_config.enable_padding": bool(engine.overheads.cuda_graph_batch_sizes)}


def _pattern(flag: Any, largest: int) -> list[int]:
    return sorted({s for r in flag.default_sizes for s in range(r.start, min(r.stop or largest, largest) + 1, r.step)})


CASES = [
    ("vllm", None, dict(model="llama-3.1-70b", hardware="h100", num_gpus=8, tp=8)),
    ("vllm", "0.15", dict(model="llama-3.1-70b", hardware="h100", num_gpus=8, tp=8)),
    ("vllm", "0.33", dict(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8)),
    ("vllm", None, dict(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8)),
    ("sglang", None, dict(model="llama-3.1-70b", hardware="h100", num_gpus=8, tp=8)),
    ("sglang", None, dict(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8)),
    ("trtllm", None, dict(model="llama-3.1-70b", hardware="h100", num_gpus=8, tp=8, precision="fp8")),
    ("trtllm", None, dict(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8)),
]


@pytest.mark.parametrize("engine,version,flags", [
    pytest.param(e, v, f, marks=ON_H200_VLLM) if (e, f["hardware"]) == ("vllm", "h200") else (e, v, f) for e, v, f in CASES
], ids=[f"{e}{v or ''}-{f['model']}" for e, v, f in CASES])
def test_every_argument_is_the_parsers_and_every_card_fact_is_set_or_defaulted_equal(engine, version, flags):
    plan, result = launch(engine, version, **flags)
    data = parser_for(engine, result.config.engine.version).data
    values = emitted(plan, data)
    settings = {s.argument: s for s in plan.settings}
    for argument, expected in card_facts(result).items():
        assert argument in settings, f"{argument}: the card's value {expected} is neither set nor defaulted"
        setting = settings[argument]
        assert setting.value == expected or list(setting.value) == expected, (argument, setting.value, expected)
        flag = data.server.find(argument)
        if setting.how == "set":
            assert values[argument] == expected, (argument, values[argument], expected)
        elif flag.default_sizes:
            assert argument not in values and _pattern(flag, expected[-1]) == expected, argument
        else:
            assert argument not in values and flag.default == expected, (argument, flag.default, expected)
    for setting in plan.settings:  # every setting the plan reports set is what the command says
        if setting.how == "set":
            want = list(setting.value) if isinstance(setting.value, tuple) else setting.value
            assert values[setting.argument] == want, setting


# ---------------------------------------------------------------------------------------------
# The commands the issue names, end to end


def test_a_vllm_run_prints_vllm_serve_with_its_tensor_parallel_size(capsys):
    assert main(["--model", "llama-3.1-70b", "--hardware", "h100", "--num-gpus", "8", "--tp", "8", "--engine", "vllm",
                 "--isl", "2000", "--osl", "500", "--emit-launch"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("vllm serve"))
    assert line.split()[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert "--tensor-parallel-size 8" in line
    assert "--async-scheduling" in out  # vLLM 0.11 defaults to synchronous scheduling; the card assumes overlap


def test_deepseek_on_sglang_with_dp_attention_and_ep_prints_sglangs_spelling(capsys):
    assert main(["--model", "deepseek-v3", "--hardware", "h200", "--num-gpus", "8", "--dp-attention", "8", "--ep", "8",
                 "--engine", "sglang", "--emit-launch"]) == 0
    out = capsys.readouterr().out
    command = out[out.index("python -m sglang.launch_server"):].replace(" \\\n", " ")
    assert "--model-path deepseek-ai/DeepSeek-V3 --tp 8 --enable-dp-attention --dp 8 --ep 8" in " ".join(command.split())


def test_json_carries_each_command_as_a_list_of_arguments(capsys):
    assert main(["--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm@0.11", "--batch-per-gpu", "32",
                 "--format", "json", "--emit-launch"]) == 0
    data = json.loads(capsys.readouterr().out)["launch"]
    argv = data["commands"][0]["argv"]
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert argv[argv.index("--max-num-seqs") + 1] == "32"  # 32 per GPU x TP1: the simulated batch
    assert {"fact": "GPU memory share", "value": 0.9, "argument": "--gpu-memory-utilization", "how": "set",
            "role": "server"} in data["settings"]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_pd_disaggregated_serve_prints_both_sides_and_the_router(capsys, engine):
    assert main(["serve", "--model", "llama-3.1-70b", "--hardware", "h100", "--tp", "8", "--precision", "fp8",
                 "--engine", engine, "--rate", "4", "--num-requests", "50", "--disaggregate", "2P1D", "--format",
                 "json", "--emit-launch"]) == 0
    launch_data = json.loads(capsys.readouterr().out)["launch"]
    roles = [(c["role"], c["where"]) for c in launch_data["commands"]]
    assert roles == [("prefill", "each of the 2 prefill instances"), ("decode", ""), ("router", roles[2][1])]
    prefill, decode, router = (c["argv"] for c in launch_data["commands"])
    assert prefill[prefill.index("--model-path") + 1 if engine == "sglang" else 2] == "nvidia/Llama-3.1-70B-Instruct-FP8"
    if engine == "sglang":
        assert prefill[prefill.index("--disaggregation-mode") + 1] == "prefill"
        assert decode[decode.index("--disaggregation-mode") + 1] == "decode"
        assert router[:3] == ["python", "-m", "sglang_router.launch_router"]
        assert router.count("--prefill") == 2 and router.count("--decode") == 1
        assert router[router.index("--prefill") + 1:router.index("--prefill") + 3] == ["http://$PREFILL_0_IP:30000", "8998"]
    else:
        assert json.loads(prefill[prefill.index("--kv-transfer-config") + 1])["kv_connector"] == "NixlConnector"
        assert router[:2] == ["vllm-router", "--vllm-pd-disaggregation"]
        assert router.count("--prefill") == 2


def test_a_serve_run_realises_its_pools_scheduler_settings(capsys):
    # the serving simulator's token budget and running cap per instance, over its DP ranks
    assert main(["serve", "--model", "qwen3-30b-a3b", "--hardware", "h100", "--dp-attention", "4", "--ep", "4",
                 "--engine", "sglang", "--concurrency", "8", "--num-requests", "16", "--format", "json",
                 "--emit-launch"]) == 0
    argv = json.loads(capsys.readouterr().out)["launch"]["commands"][0]["argv"]
    assert argv[argv.index("--chunked-prefill-size") + 1] == "8192"  # 8192 / 4 per DP rank, x 4 ranks
    assert "--max-running-requests" not in argv  # SGLang's card: bounded by the KV pool


# ---------------------------------------------------------------------------------------------
# Across nodes


def test_sglang_across_two_nodes_runs_one_command_per_node_rank():
    plan, _ = launch("sglang", model="deepseek-v3", hardware="h100", num_gpus=16, num_nodes=2, dp_attention=16, ep=16)
    assert [c.where for c in plan.commands] == ["node 0 of 2", "node 1 of 2"]
    for rank, command in enumerate(plan.commands):
        argv = list(command.argv)
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--dist-init-addr") + 1] == "$HEAD_IP:5000"
        assert argv[argv.index("--tp") + 1] == "16"


def test_vllm_data_parallel_across_nodes_puts_its_ranks_by_node():
    plan, _ = launch("vllm", model="deepseek-v3", hardware="h100", num_gpus=16, num_nodes=2, dp_attention=16, ep=16)
    head, other = (list(c.argv) for c in plan.commands)
    assert head[head.index("--data-parallel-size-local") + 1] == "8" and "--headless" not in head
    assert other[other.index("--data-parallel-start-rank") + 1] == "8" and "--headless" in other


def test_vllm_tp_across_nodes_needs_nnodes_which_0_11_lacks():
    flags = dict(model="llama-3.1-405b", hardware="h100", num_gpus=16, num_nodes=2, tp=16, precision="fp8")
    with pytest.raises(InferSimError, match="Ray cluster is not emitted"):
        launch("vllm@0.11", **flags)
    plan, _ = launch("vllm@0.15", **flags)
    second = list(plan.commands[1].argv)
    assert second[second.index("--node-rank") + 1] == "1" and "--headless" in second
    assert second[second.index("--master-addr") + 1] == "$HEAD_IP"


# ---------------------------------------------------------------------------------------------
# Layouts, precisions and versions an engine cannot spell


@pytest.mark.parametrize("engine,flags,why", [
    ("vllm", dict(model="qwen3-30b-a3b", hardware="h100", num_gpus=8, tp=4, dp_attention=2,
                  overrides=["deployment.ffn.tp=2", "deployment.ffn.ep=4"]),
     "FFN TP2 x EP4, PP1 .*any other expert TP x EP split has no vLLM spelling"),
    ("vllm", dict(model="llama-3.1-8b", hardware="h100", num_gpus=8,
                  overrides=["deployment.attention.tp=2", "deployment.attention.dp=4", "deployment.ffn.tp=8"]),
     "a dense FFN shared by data-parallel attention ranks"),
    ("sglang", dict(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8,
                    overrides=["deployment.moe_comm=all-to-all"]), "no NCCL all-to-all MoE path"),
    ("trtllm", dict(model="deepseek-v3", hardware="h200", num_gpus=8, tp=2, dp_attention=4, ep=8),
     "attention TP 1"),
    ("trtllm", dict(model="llama-3.1-8b", hardware="h100", precision="fp8",
                    overrides=["model.quantized_checkpoints={}"]), "pre-quantised checkpoints only"),
])
def test_what_an_engine_cannot_express_is_refused_with_the_reason(engine, flags, why):
    flags = dict(flags)
    overrides = flags.pop("overrides", [])
    config = load_run_config(None, overrides, None, RunFlags(engine=engine, **flags))
    with pytest.raises(InferSimError, match=why):
        plan_for_run(simulate(config))


def test_an_unquantised_checkpoint_is_quantised_while_loading_where_the_engine_can():
    config = load_run_config(None, ["model.quantized_checkpoints={}"], None,
                             RunFlags(model="llama-3.1-8b", hardware="h100", engine="vllm", precision="fp8"))
    plan = plan_for_run(simulate(config))
    argv = list(plan.commands[0].argv)
    assert argv[2] == "meta-llama/Llama-3.1-8B-Instruct" and argv[argv.index("--quantization") + 1] == "fp8"


@ON_H200_VLLM
def test_a_card_without_a_checkpoint_asks_for_one(capsys):
    assert main(["--model", "qwen3.5-35b-a3b", "--hardware", "h200", "--engine", "vllm", "--emit-launch"]) == 2
    assert "--set model.checkpoint=REPO" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The parser data: chosen by version, validated on load


def test_the_parser_data_is_the_nearest_version_at_or_below_the_cards():
    assert parser_for("vllm", "0.11").data.version == "0.11.0"
    assert parser_for("vllm", "0.15").data.version == "0.15.1"
    chosen = parser_for("vllm", "0.16.2")
    assert chosen.data.version == "0.15.1" and "nearest known at or below the engine card's 0.16.2" in chosen.note
    assert parser_for("sglang", "0.5.9").data.version == "0.5.2"
    with pytest.raises(InferSimError, match="no vLLM parser data at or below 0.10"):
        parser_for("vllm", "0.10")
    plan, _ = launch("vllm", "0.16.2", model="llama-3.1-8b", hardware="h100")
    assert plan.parser.startswith("flags of vLLM 0.15.1's parser, the nearest known")


def test_every_bundled_parser_file_loads_and_names_its_version():
    for framework in ("vllm", "sglang", "trtllm"):
        for path in known_versions(framework).values():
            data = load_parser_data(path)
            assert data.framework == framework and path.stem == f"{framework}-{data.version}"
            assert all(flag.source and flag.meaning for flag in data.server.flags)


@pytest.mark.parametrize("edit,key,problem", [
    (lambda d: d["server"]["flags"][0].update(colour="red"), "server.flags[0].colour", "unknown key"),
    (lambda d: d["server"]["flags"].append(dict(d["server"]["flags"][0])), "server.flags", "named twice"),
    (lambda d: next(f for f in d["server"]["flags"] if f["kind"] == "choice").update(default="nope"), "default",
     "not one of its choices"),
    (lambda d: d.update(version="latest"), "version", "expected a version of numbers"),
])
def test_a_bad_parser_file_is_one_message_naming_the_key(tmp_path, edit, key, problem):
    data = yaml.safe_load((DATA_DIR / "vllm-0.11.0.yaml").read_text())
    edit(data)
    path = tmp_path / "vllm-0.11.0.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_parser_data(path)
    assert key in str(err.value) and problem in str(err.value)


# ---------------------------------------------------------------------------------------------
# Speculative decoding and the chosen rows of sweeps


def test_a_vllm_011_card_that_schedules_asynchronously_is_launched_so_and_warned_of_speculation(tmp_path):
    """A 0.11 card set to async scheduling (overheads.overlap_scheduler) launches with
    --async-scheduling, and with speculative decoding the plan says 0.11 turns it off
    (SchedulerConfig.async_scheduling)."""
    card = yaml.safe_load((Path(__file__).resolve().parent.parent / "engines" / "vllm-0.11.yaml").read_text())
    card["overheads"]["overlap_scheduler"] = True
    path = tmp_path / "vllm-async.yaml"
    path.write_text(yaml.safe_dump(card))
    spec = ["speculative.method=mtp", "speculative.acceptance_rate=0.7", "speculative.lookahead=2"]
    flags = RunFlags(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8, engine=str(path))
    plan = plan_for_run(simulate(load_run_config(None, spec, None, flags)))
    assert "--async-scheduling" in plan.commands[0].argv
    assert any("does not run async scheduling" in note for note in plan.notes)


def test_mtp_speculation_is_each_engines_own_spelling():
    spec = ["speculative.method=mtp", "speculative.acceptance_rate=0.7", "speculative.lookahead=2"]
    flags = RunFlags(model="deepseek-v3", hardware="h200", num_gpus=8, dp_attention=8, ep=8, engine="vllm@0.11")
    plan = plan_for_run(simulate(load_run_config(None, spec, None, flags)))
    argv = list(plan.commands[0].argv)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert "--async-scheduling" not in argv  # vLLM 0.11 schedules synchronously by default, as simulated
    plan = plan_for_run(simulate(load_run_config(None, spec, None, replace(flags, engine="sglang@0.5"))))
    argv = list(plan.commands[0].argv)
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "3"
    assert "--disable-overlap-schedule" in argv  # the 0.5 card: SGLang turns overlap off for EAGLE/MTP
    plan = plan_for_run(simulate(load_run_config(None, spec, None, replace(flags, engine="sglang"))))
    assert "--disable-overlap-schedule" not in plan.commands[0].argv  # 0.5.23 keeps its overlap under EAGLE


def test_pareto_prints_each_frontier_points_command_or_why_there_is_none(capsys):
    assert main(["pareto", "--model", "qwen3-30b-a3b", "--hardware", "h100", "--engine", "vllm@0.11", "--gpus", "2",
                 "--batch", "8,64", "--executor", "serial", "--no-progress", "--emit-launch"]) == 0
    out = capsys.readouterr().out
    frontier = int(out.split("Pareto frontier: ")[1].split(" ")[0])
    launches = [line for line in out.splitlines() if line.startswith("LAUNCH  2 GPU(s)")]
    assert len(launches) == frontier
    assert all(line.endswith("(engines/launch/vllm-0.11.0.yaml)") or ": none: vLLM 0.11.0 cannot run" in line
               for line in launches)


def test_a_checkpoint_keyed_by_no_weight_format_is_refused_on_load():
    with pytest.raises(ConfigError, match=r"quantized_checkpoints\.fp9.*keyed by a weight format"):
        load_run_config(None, ["model.quantized_checkpoints.fp9=some/repo"], None,
                        RunFlags(model="qwen3-8b", hardware="h100"))
