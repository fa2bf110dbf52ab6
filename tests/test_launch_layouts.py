"""What a layout search proposes and what a bundled example runs are what the engine can launch.

The layout search keeps to the launch module's own rule of what each engine's flags express (each
speller's check_layout, which spelling a command passes first): every searched layout it keeps
spells a command, the ones it leaves out are counted in a note with the reason, and every bundled
example config emits its own launch command.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.cli.main import main
from infersim.launch.build import layout_check, plan_for_config
from infersim.launch.common import LaunchRefusal
from infersim.run.flags import RunFlags
from infersim.sweep import Search, SweepSpec, load_base, run_sweep
from infersim.sweep.evaluate import row_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
#: bundled configs whose launch command is refused, with the reason the refusal names (none today)
REFUSED: dict[str, str] = {}


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_bundled_config_emits_its_own_launch_command(name, capsys):
    code = main(["--config", name, "--emit-launch"])
    out, err = capsys.readouterr()
    if name in REFUSED:
        assert code == 2 and REFUSED[name] in err
        return
    assert code == 0, err
    assert "\nLAUNCH  " in out and "infersim: error" not in err


def _search(engine: str, model: str, gpus: tuple[int, ...]) -> SweepSpec:
    base = load_base(None, [], None, RunFlags(model=model, hardware="h100", engine=engine))
    return SweepSpec(base, search=Search(gpus=gpus, batches=(8,), include_max_batch=False))


@pytest.mark.parametrize("engine,model", [
    ("vllm", "qwen3-30b-a3b"), ("vllm@0.11", "qwen3-8b"), ("sglang", "qwen3-30b-a3b"), ("trtllm", "qwen3-30b-a3b"),
])
def test_a_layout_search_keeps_only_layouts_the_engine_can_launch(engine, model):
    spec = _search(engine, model, (8,))
    result = run_sweep(spec, workers=1)
    rows = [r for r in result.rows if r.ok]
    assert rows and result.unlaunchable, "8 GPUs hold layouts every engine refuses (e.g. FFN TP2 x EP4 under DP2)"
    check = layout_check(spec.base.config.engine)
    assert check is not None
    layouts = {(r.attn_tp, r.ffn_tp, r.ffn_ep, r.pp): r for r in rows}
    for row in layouts.values():
        config = row_config(spec, row)
        check(config.deployment, config.model)  # the rule the search kept to
        plan = plan_for_config(config, row.batch)  # and the command it stands for
        assert plan.commands
    # the search left nothing out that the rule would have kept: every refused layout is refused again
    assert sum(result.unlaunchable.values()) == sum(
        n for reasons in result.by_point.values() for why, n in reasons.items() if "cannot launch it" in why)


def test_pareto_on_vllm_proposes_no_layout_it_cannot_launch_and_says_how_many_it_left_out(capsys):
    assert main(["pareto", "--model", "qwen3-30b-a3b", "--hardware", "h100", "--engine", "vllm", "--gpus", "8",
                 "--batch", "8,64", "--executor", "serial", "--no-progress", "--emit-launch"]) == 0
    out, err = capsys.readouterr()
    launches = [line for line in out.splitlines() if line.startswith("LAUNCH  ")]
    assert launches and not [line for line in launches if ": none: " in line]
    note = next(line for line in err.splitlines() if "layouts left out" in line)
    # attention TP x DP x FFN TP x EP on 8 GPUs (PP 1, 2, 4, 8) that vLLM has no flags for: an expert TP x EP
    # split other than EP over every GPU, and FFN groups other than the attention TP group or the whole stage
    assert "engine vllm 0.33.0 cannot launch" in note
    assert "any other expert TP x EP split has no vLLM spelling" in note
    left_out = int(note.split("layout search: ")[1].split(" ")[0])
    assert left_out > 0


def test_a_search_whose_every_layout_the_engine_cannot_launch_says_so(capsys):
    # TensorRT-LLM servers span one node here (a multi-node one starts under MPI, not emitted): 16 H100s have none
    code = main(["pareto", "--model", "qwen3-8b", "--hardware", "h100", "--engine", "trtllm", "--gpus", "16",
                 "--batch", "8", "--executor", "serial", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert "multi-node TensorRT-LLM server starts under MPI" in err
    assert "empty Pareto frontier: no configuration could be simulated: " in err
    assert "searched layouts left out that engine trtllm 1.0 cannot launch" in err


def test_the_rule_refuses_what_the_speller_refuses_with_the_same_reason():
    spec = _search("vllm", "qwen3-30b-a3b", (8,))
    base = spec.base.config
    from dataclasses import replace

    from infersim.cards.deployment import AttentionLayout, FfnLayout, complete_layout

    dep = complete_layout(replace(base.deployment, num_gpus=8, attention=AttentionLayout(tp=4, dp=0),
                                  ffn=FfnLayout(tp=2, ep=4, dp=0), moe_comm="all-gather"),
                          base.model, base.hardware, "")
    check = layout_check(base.engine)
    assert check is not None
    with pytest.raises(LaunchRefusal) as refused:
        check(dep, base.model)
    with pytest.raises(LaunchRefusal) as spelled:
        plan_for_config(replace(base, deployment=dep), 8)
    assert refused.value.why == spelled.value.why
    assert "FFN TP2 x EP4" in str(spelled.value)


# ---------------------------------------------------------------------------------------------
# --num-gpus alone on a dense model: DP replicas, simulated and launched as the same thing


def _dense_run(engine: str, **flags):
    from infersim.run.config import load_run_config
    from infersim.run.simulate import simulate

    config = load_run_config(None, flags.pop("overrides", []), None,
                             RunFlags(model="qwen3-8b", hardware="h100", engine=engine, **flags))
    return config, simulate(config)


def _operations(result) -> set[str]:
    return {op.name for stage in (result.prefill, result.decode) for op in stage.operations}


@pytest.mark.parametrize("engine,replicas_flag,absent", [
    ("vllm", "--data-parallel-size", "--enable-expert-parallel"),
    ("sglang", "--dp", "--enable-dp-attention"),
])
def test_num_gpus_alone_on_a_dense_model_runs_independent_replicas_as_the_command_launches_them(
        engine, replicas_flag, absent):
    from infersim.launch.build import plan_for_run

    config, result = _dense_run(engine, num_gpus=8)
    dep = config.deployment
    assert (dep.attention.tp, dep.attention.dp, dep.ffn.tp, dep.ffn.dp) == (1, 8, 1, 8)
    # each replica computes its own logits: no LM head gathered over the 8 ranks, no DP-gather step
    assert dep.lm_head == "per-rank"
    assert not {"lm_head_gather", "logits_all_gather"} & _operations(result)
    assert any("8 independent replicas of the model" in note for note in config.notes)
    argv = list(plan_for_run(result).commands[0].argv)
    assert argv[argv.index(replicas_flag) + 1] == "8" and absent not in argv
    if engine == "sglang":
        # without DP attention SGLang does not divide --chunked-prefill-size by --dp: the card's 8192 per replica
        assert argv[argv.index("--chunked-prefill-size") + 1] == "8192"


def test_sglang_dp_attention_on_a_dense_model_still_gathers_its_lm_head():
    from infersim.launch.build import plan_for_run

    config, result = _dense_run("sglang", num_gpus=8, overrides=["deployment.attention.dp=8", "deployment.ffn.tp=8"])
    assert config.deployment.lm_head == "gathered"
    assert {"lm_head_gather", "logits_all_gather"} <= _operations(result)
    assert not any("independent replicas" in note for note in config.notes)
    argv = list(plan_for_run(result).commands[0].argv)
    assert "--enable-dp-attention" in argv
    assert argv[argv.index("--chunked-prefill-size") + 1] == "8192"  # 1024 per DP rank x 8: the server's figure


def test_a_gathered_lm_head_named_on_replicas_is_refused_with_why(capsys):
    code = main(["--model", "qwen3-8b", "--hardware", "h100", "--engine", "sglang", "--num-gpus", "8",
                 "--set", "deployment.lm_head=gathered"])
    err = capsys.readouterr().err
    assert code == 2
    assert "deployment.lm_head" in err and "8 independent replicas, each computing its own logits" in err


def test_emit_launch_on_a_deployment_that_does_not_fit_is_one_message(capsys):
    code = main(["--model", "llama-3.1-70b", "--hardware", "h100", "--num-gpus", "1", "--engine", "vllm",
                 "--emit-launch"])
    out, err = capsys.readouterr()
    assert code == 1 and "LAUNCH" not in out
    lines = [line for line in err.splitlines() if line.startswith("infersim:") and "note:" not in line]
    assert len(lines) == 1 and lines[0].startswith("infersim: does not fit (so --emit-launch has no command for it): ")
