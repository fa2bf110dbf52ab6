"""An engine's pool of recurrent-state slots for hybrid linear-attention and Mamba models (engine card
memory.recurrent_state_pool): SGLang sets it apart from the KV space before it sizes the KV pool, and
caps its running requests at the slots a request holds. Hand-derived on a tiny Gated DeltaNet model
(one GDN layer keeping 1,408 bytes of states a request, one full layer of 128 bytes a token)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fixtures import FREE_ENGINE, TINY_MODEL, make_config
from infersim.base.errors import ConfigError
from infersim.cards.engine import EngineCard, validate_engine
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.run.memory import memory_budget
from infersim.run.simulate import fit_problems

GDN = {**TINY_MODEL, "name": "tiny-gdn", "layer_types": ["linear_attention", "full_attention"],
       "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
       "linear_conv_kernel_dim": 4, "linear_chunk_size": 4}
SLOT = 4 * 64 * 4 + 3 * 64 * 2  # 4 value heads of 8 x 8 fp32 states + 3 conv columns of 64 bf16 channels
CONTEXT = 12  # ISL 8 + OSL 4
PER_TOKEN = 128  # the full layer: K and V, 2 heads of 16, bf16


def _engine(**pool: float) -> EngineCard:
    data = copy.deepcopy(FREE_ENGINE)
    if pool:
        data["memory"]["recurrent_state_pool"] = dict(pool)
    return validate_engine(build(EngineCard, data, "e.yaml"), "e.yaml")


def _memory(engine: EngineCard, **deployment: object):
    cfg = make_config(GDN, workload={"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 8, "decode_batch_per_gpu": 2},
                      **deployment)
    return memory_budget(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, None, engine)


def test_a_share_of_the_memory_becomes_whole_slots_less_one_and_the_rest_the_kv_pool():
    space = _memory(_engine()).kv_capacity_bytes  # no state pool: states share the KV space
    mem = _memory(_engine(memory_ratio=1.0, slots_per_request=2, padding_slots=1))
    whole = int(space * 0.5 // SLOT)
    assert mem.state_pool is not None
    assert (mem.state_pool.slots, mem.state_pool.slot_bytes_per_gpu) == (whole - 1, SLOT)
    assert mem.kv_capacity_bytes == pytest.approx(space - whole * SLOT)
    assert mem.request_bytes_per_gpu == CONTEXT * PER_TOKEN  # the states are in their pool
    assert mem.state_pool.requests == (whole - 1) // 2
    assert mem.kv_fit_batch_per_gpu == min(int(mem.kv_capacity_bytes // (CONTEXT * PER_TOKEN)), (whole - 1) // 2)
    assert mem.binding_limit == "recurrent-state pool"  # 768 bytes a request of KV, 2 x 1,408 of states
    assert mem.pool_tokens(1) == int(mem.kv_capacity_bytes / PER_TOKEN)


def test_fixed_slots_are_a_servers_split_over_its_attention_dp_ranks():
    space = _memory(_engine(), num_gpus=4, attention={"tp": 1, "dp": 4}, ffn={"tp": 4}).kv_capacity_bytes
    mem = _memory(_engine(slots=512, slots_per_request=1), num_gpus=4, attention={"tp": 1, "dp": 4}, ffn={"tp": 4})
    assert mem.state_pool is not None and mem.state_pool.slots == 128
    assert mem.kv_capacity_bytes == pytest.approx(space - 128 * SLOT)
    assert mem.kv_fit_batch_per_gpu == 128


def _problems(engine: EngineCard, **deployment: object) -> list[str]:
    cfg = make_config(GDN, workload={"isl": 8, "osl": 4, "prefill_tokens_per_gpu": 8, "decode_batch_per_gpu": 1},
                      **deployment)
    cfg = replace(cfg, engine=engine)
    return fit_problems(cfg, memory_budget(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, None, engine), 1)


def test_a_state_pool_that_leaves_no_request_per_gpu_says_why():
    space = _memory(_engine()).kv_capacity_bytes
    too_many = int(space // SLOT * 1.5)  # fixed slots past the whole KV space
    (problem,) = _problems(_engine(slots=too_many, slots_per_request=1))
    assert problem == (f"free's recurrent-state pool ({too_many:,} slots, {too_many * SLOT / 1e9:,.2f} GB per GPU; engine "
                       "card memory.recurrent_state_pool) leaves no KV cache space beside the weights: over by "
                       f"{(too_many * SLOT - space) / 1e9:,.2f} GB; fix: more GPUs")
    (problem,) = _problems(_engine(slots=3, slots_per_request=1), num_gpus=4, attention={"tp": 4}, ffn={"tp": 4})
    assert "holds 3 running requests per scheduler, fewer than its 4 GPUs (attention TP x PP)" in problem


def test_a_model_without_recurrent_layers_gets_no_state_pool():
    cfg = make_config(TINY_MODEL)
    assert memory_budget(cfg.model, cfg.hardware, cfg.deployment, cfg.workload, None,
                         _engine(memory_ratio=0.9, slots_per_request=5)).state_pool is None


@pytest.mark.parametrize("pool", [{"memory_ratio": 0.9, "slots": 512}, {"slots_per_request": 5}])
def test_the_pool_is_a_share_of_the_memory_or_a_number_of_slots_not_both_nor_neither(pool):
    with pytest.raises(ConfigError) as caught:
        _engine(**pool)
    assert (caught.value.source, caught.value.field) == ("e.yaml", "memory.recurrent_state_pool")
    assert "either as a share of the memory (memory_ratio) or as a number (slots)" in caught.value.problem


QWEN3_NEXT_TP4 = ["--model", "qwen3-next-80b-a3b", "--hardware", "h100", "--num-gpus", "4", "--tp", "4", "--isl", "2000",
                  "--osl", "500"]


def test_sglang_caps_qwen3_next_at_a_fifth_of_its_state_slots(capsys):
    """Qwen3-Next-80B on 4 x H100: 36 Gated DeltaNet layers keep 8 value heads of 128 x 128 fp32 states
    and 3 conv columns of 2,048 bf16 channels on each GPU, 19,316,736 bytes a request. SGLang 0.5.23
    gives its state slots 0.9 / 1.9 of the KV space and a running request holds 5 of them."""
    assert main([*QWEN3_NEXT_TP4, "--engine", "sglang", "--format", "json"]) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    pool = mem["recurrent_state_pool"]
    slot = 36 * (8 * 128 * 128 * 4 + 3 * 2048 * 2)
    assert pool["slot_bytes_per_gpu"] == slot == 19_316_736 and pool["slots_per_request"] == 5
    space = mem["kv_capacity_gb"] * 1e9 + pool["held_gb"] * 1e9
    assert pool["slots"] == int(space * 0.9 / 1.9 // slot) - 1
    assert pool["requests_per_scheduler"] == pool["slots"] // 5
    assert mem["kv_fit_batch_per_gpu"] == pool["requests_per_scheduler"] // 4
    assert mem["binding_limit"] == "recurrent-state pool"
    assert main([*QWEN3_NEXT_TP4, "--engine", "vllm", "--format", "json"]) == 0
    assert "recurrent_state_pool" not in json.loads(capsys.readouterr().out)["memory"]


def test_a_batch_above_what_the_state_pool_holds_is_said_to_be_so(capsys):
    assert main([*QWEN3_NEXT_TP4, "--engine", "sglang", "--batch-per-gpu", "60"]) == 1  # does not fit
    err = capsys.readouterr().err
    assert "decode batch 60 per GPU is more than sglang's recurrent-state pool holds: " in err
    assert "5 slots a request; engine card memory.recurrent_state_pool); at most 38 requests per GPU fit" in err


def test_serve_caps_its_running_requests_at_the_state_pools(capsys):
    assert main(["serve", *QWEN3_NEXT_TP4, "--engine", "sglang", "--rate", "5", "--num-requests", "20"]) == 0
    out = capsys.readouterr().out
    assert "running cap 155, " in out and "running cap 155 from its recurrent-state pool (155 requests per scheduler)" in out


def test_a_state_pool_holding_no_request_is_refused_by_the_run_and_by_serve():
    from infersim.base.errors import NotPossible
    from infersim.serve.settings import settings_from_engine

    engine = _engine(slots=1, slots_per_request=2)
    (problem,) = _problems(engine)
    assert problem.endswith("holds no running request: a request holds 2 slots; fix: more memory per GPU")
    cfg = replace(make_config(GDN), engine=engine)
    with pytest.raises(NotPossible) as caught:
        settings_from_engine(cfg, 8, 4, offline=False)
    assert str(caught.value) == "does not fit: " + problem


@pytest.mark.parametrize("rule, asked, on, said", [
    ("default", None, True, ""), ("default", False, False, ""),
    ("opt-in", None, False, "keeps it off for a model with recurrent layers unless turned on"),
    ("opt-in", True, True, ""),
    ("never", None, False, "turns it off for a model with recurrent layers, whatever asks for it"),
    ("never", True, False, "turns it off for a model with recurrent layers, whatever asks for it"),
    ("never", False, False, ""),
])
def test_an_engines_prefix_cache_for_a_model_with_recurrent_layers(rule, asked, on, said):
    """vLLM 0.11 and SGLang 0.5.2 turn it off whatever the flags, vLLM 0.15 unless asked."""
    from infersim.serve.settings import settings_from_engine

    data = copy.deepcopy(FREE_ENGINE)
    data["scheduler"]["prefix_cache"] = True
    data["scheduler"]["recurrent_prefix_cache"] = rule
    engine = validate_engine(build(EngineCard, data, "e.yaml"), "e.yaml")
    settings = settings_from_engine(replace(make_config(GDN), engine=engine), 8, 4, offline=False, prefix_cache=asked)
    assert settings.prefix_cache is on
    assert (f"; prefix cache off: free {engine.version} {said}" in settings.origin) if said else \
        "prefix cache off" not in settings.origin
    plain = settings_from_engine(replace(make_config(TINY_MODEL), engine=engine), 8, 4, offline=False, prefix_cache=asked)
    assert plain.prefix_cache is (asked is not False)  # no recurrent layers: as asked, else as the card has it


@pytest.mark.parametrize("card, rule", [("vllm@0.11", "never"), ("vllm@0.15.1", "opt-in"), ("vllm@0.33.0", "default"),
                                        ("sglang@0.5", "never"), ("sglang@0.5.23", "default")])
def test_the_bundled_engines_prefix_cache_rules_for_recurrent_models(card, rule):
    from infersim.run.config import load_engine_card

    assert load_engine_card(card)[0].scheduler.recurrent_prefix_cache == rule


def test_a_launch_command_keeps_the_engines_prefix_cache_for_a_recurrent_model(capsys):
    """vLLM 0.15 keeps prefix caching off for Qwen3-Next unless asked: the command does not turn it on."""
    assert main([*QWEN3_NEXT_TP4, "--engine", "vllm@0.15.1", "--emit-launch"]) == 0
    assert " --no-enable-prefix-caching " in capsys.readouterr().out


@settings(max_examples=40, deadline=None)
@given(ratio=st.floats(0.05, 4.0), per_request=st.integers(1, 8))
def test_a_state_pool_by_share_stays_within_its_share_and_more_memory_never_runs_fewer(ratio, per_request):
    """The slots take at most ratio / (1 + ratio) of the KV space, whole slots of one request's states,
    the rest stays KV space; a larger share never holds fewer running requests."""
    space = _memory(_engine()).kv_capacity_bytes
    mem = _memory(_engine(memory_ratio=ratio, slots_per_request=per_request, padding_slots=1))
    pool = mem.state_pool
    assert pool is not None and pool.held_bytes_per_gpu == (pool.slots + 1) * SLOT
    assert pool.held_bytes_per_gpu <= space * ratio / (1 + ratio) + 1e-6
    assert mem.kv_capacity_bytes == pytest.approx(space - pool.held_bytes_per_gpu)
    assert pool.requests == pool.slots // per_request
    larger = _memory(_engine(memory_ratio=ratio * 1.5, slots_per_request=per_request, padding_slots=1)).state_pool
    assert larger is not None and larger.requests >= pool.requests
