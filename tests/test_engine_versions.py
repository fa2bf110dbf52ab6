"""Engine cards by version (vllm@0.15, sglang@0.5.x), the GPUs an engine runs on, and the mechanisms
the current vLLM and SGLang cards carry: attention backend per GPU, capture sizes that follow
max_num_seqs, the kernels a step runs outside its graph, piecewise prefill graphs and the all-reduce +
RMSNorm fusion. Every number below is worked out by hand from the card and the model."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import REPO_ROOT

from infersim.cards.engine import EngineCard, StepPieces, step_overhead, validate_engine
from infersim.cards.registry import engine_family, resolve_name
from infersim.cards.schema import build
from infersim.cli.main import main
from infersim.run.config import (
    config_from_mapping,
    load_engine_card,
    load_hardware_card,
    load_run_config,
)
from infersim.base.errors import ConfigError, InferSimError
from infersim.run.flags import RunFlags
from infersim.run.simulate import simulate

H100 = load_hardware_card("h100")[0]
B200 = load_hardware_card("b200")[0]
A100 = load_hardware_card("a100")[0]
KERNEL = H100.derates.kernel_launch_overhead  # 4 us: the hardware card's time per small kernel


def raw_card(name: str) -> dict:
    return yaml.safe_load((REPO_ROOT / "engines" / f"{name}.yaml").read_text())


def amd_gpu() -> dict:
    """The H100 card relabelled as an AMD GPU (no AMD card is bundled yet)."""
    data = yaml.safe_load((REPO_ROOT / "hardware" / "h100-sxm.yaml").read_text())
    data.update(name="amd-test-gpu", vendor="amd", compute_capability=None, aliases=[])
    return data


# ---- selecting a version ---------------------------------------------------------------------


def test_a_plain_name_means_the_newest_card_and_a_version_selects_one():
    vllm = engine_family("vllm")
    assert [e.version for e in vllm] == ["0.11", "0.15.1", "0.33.0"]
    assert load_engine_card("vllm")[0].version == "0.33.0"
    assert load_engine_card("vllm@0.15")[0].version == "0.15.1"  # a prefix of the card's version
    assert load_engine_card("vllm@0.15.1")[0].version == "0.15.1"
    assert load_engine_card("vllm@0.11")[0].version == "0.11"
    assert load_engine_card("sglang")[0].version == "0.5.23"
    assert load_engine_card("sglang@0.5.x")[0].version == "0.5.23"  # the newest 0.5
    assert load_engine_card("sglang@0.5")[0].version == "0.5"  # an exact version wins over a prefix
    assert load_engine_card("SGLang@0.5.23")[0].version == "0.5.23"
    # exact names make no note; a version reached by prefix or a forgiving name says what it took
    assert resolve_name("vllm@0.15.1", "engines")[1] == ""
    assert resolve_name("vllm@0.15", "engines")[1] == "engine 'vllm@0.15' -> vllm-0.15 (vllm 0.15.1)"


def test_an_unknown_version_lists_the_known_ones():
    with pytest.raises(InferSimError) as err:
        load_engine_card("vllm@0.9")
    assert str(err.value) == ("engine 'vllm@0.9': no bundled vllm card of version '0.9'; bundled vllm versions: "
                              "0.11 (vllm@0.11), 0.15.1 (vllm@0.15.1), 0.33.0 (vllm@0.33.0); 'vllm' alone means the "
                              "newest")


def test_a_run_config_names_a_version(capsys):
    flags = RunFlags(model="llama-3.1-8b", hardware="h100", isl=100, osl=10, batch_per_gpu=4)
    config = load_run_config(None, ("engine=vllm@0.15",), flags=flags)
    assert (config.engine.name, config.engine.version) == ("vllm", "0.15.1")
    assert main(["--model", "llama-3.1-8b", "--hardware", "h100", "--engine", "vllm@0.15", "--isl", "100",
                 "--osl", "10", "--batch-per-gpu", "4"]) == 0
    engine_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  engine:"))
    assert engine_line.startswith("  engine:     vllm 0.15.1 (") and engine_line.endswith("; attention FLASH_ATTN (FA3)")


# ---- the GPUs an engine runs on ----------------------------------------------------------------


def test_an_engine_refuses_a_gpu_vendor_it_does_not_run_on():
    raw = {"model": "llama-3.1-8b", "hardware": amd_gpu(), "engine": "trtllm", "deployment": {"num_gpus": 1},
           "workload": {"isl": 100, "osl": 10, "decode_batch_per_gpu": 4}}
    with pytest.raises(ConfigError) as err:
        config_from_mapping(copy.deepcopy(raw), "test")
    message = str(err.value)
    assert "field 'vendors'" in message and "engine trtllm 1.0 does not run on amd GPUs" in message
    assert "engine cards for amd GPUs: sglang@0.5.23, vllm@0.15.1, vllm@0.33.0" in message
    raw["engine"] = "vllm@0.15"
    config = config_from_mapping(raw, "test")
    assert config.engine.attention_backend(config.hardware, mla=False).backend == "TRITON_ATTN"


def test_hardware_cards_name_their_vendor():
    assert H100.vendor == "nvidia" == B200.vendor
    data = amd_gpu()
    data["vendor"] = "intel"
    with pytest.raises(ConfigError, match="vendor"):
        config_from_mapping({"model": "llama-3.1-8b", "hardware": data, "deployment": {"num_gpus": 1},
                             "workload": {"isl": 10, "osl": 2}}, "test")


# ---- attention backend and the page size it forces -----------------------------------------------


@pytest.mark.parametrize("engine, gpu, mla, backend, page", [
    ("vllm@0.15", H100, False, "FLASH_ATTN (FA3)", 16), ("vllm@0.15", B200, False, "FLASHINFER", 16),
    ("vllm@0.15", A100, False, "FLASH_ATTN (FA2)", 16), ("vllm@0.15", H100, True, "FLASH_ATTN_MLA", 64),
    ("vllm@0.15", B200, True, "FLASHINFER_MLA", 64), ("vllm@0.15", A100, True, "TRITON_MLA", 16),
    ("vllm@0.33", B200, True, "FLASHINFER_MLA", 32), ("sglang@0.5.23", H100, False, "fa3", 1),
    ("sglang@0.5.23", B200, False, "trtllm_mha", 64), ("sglang@0.5.23", A100, False, "flashinfer", 1),
])
def test_the_attention_backend_follows_the_gpu(engine, gpu, mla, backend, page):
    card = load_engine_card(engine)[0]
    assert card.attention_backend(gpu, mla).backend == backend
    assert card.page_size(gpu, mla) == page


# ---- CUDA-graph sizes that follow max_num_seqs -----------------------------------------------------


def with_limits(name: str, seqs: int, tokens: int) -> EngineCard:
    data = raw_card(name)
    data["scheduler"]["max_running_requests"] = [{"min_gpu_bytes": 0, "value": seqs}]
    data["scheduler"]["chunked_prefill_tokens"] = [{"min_gpu_bytes": 0, "value": tokens}]
    return validate_engine(build(EngineCard, data, "test"), "test")


def test_the_largest_graph_is_twice_max_num_seqs_within_the_ceiling_and_the_token_budget():
    hbm = H100.peak.hbm_bytes
    v15 = load_engine_card("vllm@0.15")[0]
    assert v15.graph_max_batch(hbm, hw=H100) == 512  # min(2 x 1024, 512, 8192)
    assert with_limits("vllm-0.15", 128, 2048).graph_max_batch(hbm, hw=H100) == 256  # 2 x 128
    assert with_limits("vllm-0.15", 128, 200).graph_max_batch(hbm, hw=H100) == 200  # the token budget
    v33 = load_engine_card("vllm@0.33")[0]
    assert v33.graph_max_batch(B200.peak.hbm_bytes, hw=B200) == 1024  # SM100 ceiling: min(2 x 1024, 1024, 16384)
    assert v33.graph_max_batch(H100.peak.hbm_bytes, hw=H100) == 512
    # 0.15 pads 100 requests to the captured 104; 0.33 captures max_num_seqs = 100 itself
    assert with_limits("vllm-0.15", 100, 2048).graph_padded_batch(100, hbm, hw=H100) == 104
    assert with_limits("vllm-0.33", 100, 2048).graph_padded_batch(100, hbm, hw=H100) == 100
    assert with_limits("vllm-0.33", 100, 2048).graph_padded_batch(99, hbm, hw=H100) == 100  # min(104, 100)
    # past twice max_num_seqs nothing is captured: eager, unpadded
    assert with_limits("vllm-0.15", 100, 2048).graph_padded_batch(201, hbm, hw=H100) == 201


# ---- what a step runs outside its graph ------------------------------------------------------------


def test_a_decode_step_pays_the_kernels_outside_its_graph_at_the_gpus_kernel_time():
    v15 = load_engine_card("vllm@0.15")[0]
    # 10 ms of GPU work hides the CPU (1 ms + 64 x 10 us): what remains is 14 kernels x 4 us
    o = step_overhead(v15, "decode", 10e-3, 64, 300, H100.peak.hbm_bytes, pieces=StepPieces(H100))
    assert o.graph and o.seconds == pytest.approx(14 * KERNEL) == pytest.approx(56e-6)
    # the 0.11 card's 0.5 ms estimate stands where the card counts no kernels, and its synchronous
    # scheduler exposes the CPU: 1 ms + 64 x 10 us
    old = load_engine_card("vllm@0.11")[0]
    assert step_overhead(old, "decode", 10e-3, 64, 300, H100.peak.hbm_bytes, pieces=StepPieces(H100)).seconds \
        == pytest.approx(0.5e-3 + 1e-3 + 64 * 10e-6)


def decode_step(engine: str, model: str, tp: int, batch_per_gpu: int, hardware: str = "h100"):
    flags = RunFlags(model=model, hardware=hardware, engine=engine, tp=tp, isl=1500, osl=200,
                     batch_per_gpu=batch_per_gpu)
    return simulate(load_run_config(None, flags=flags, mfu_tables="none")).decode


def test_vllm_015_decode_differs_from_011_by_the_overhead_alone():
    # 0.11: 0.5 ms fixed and, scheduling synchronously (async scheduling off by default), its CPU
    # time exposed (1 ms + 10 us a request); 0.15: 14 kernels outside the graph, the CPU hidden
    old, new = decode_step("vllm@0.11", "llama-3.1-8b", 1, 64), decode_step("vllm@0.15", "llama-3.1-8b", 1, 64)
    assert old.step_time_s - new.step_time_s == pytest.approx(0.5e-3 + 1e-3 + 64 * 10e-6 - 14 * KERNEL)


def eager_launches(stage) -> int:
    detail = next(op.detail for op in stage.operations if op.name == "scheduler")
    return int(detail.split(" requests, ")[1].split(" eager launches")[0])


def prefill_step(engine: str, isl: int, hardware: str | dict = "h100"):
    raw = {"model": "llama-3.1-8b", "hardware": hardware, "engine": engine, "deployment": {"num_gpus": 1},
           "workload": {"isl": isl, "osl": 10, "decode_batch_per_gpu": 1}, "mfu_tables": "none"}
    return simulate(config_from_mapping(raw, "test")).prefill


def test_prefill_replays_graph_pieces_up_to_the_limit_and_launches_only_the_breaks():
    # Llama-3.1-8B launches 10 kernels a layer (rope_kv_store 2) + 3 per step = 323; the graph breaks at
    # attention (1) and the KV write (rope_kv_store, 2) of each of its 32 layers: 96 eager launches
    assert eager_launches(prefill_step("vllm@0.15", 200)) == 96  # 200 tokens <= the 512-token graph limit
    assert eager_launches(prefill_step("vllm@0.15", 900)) == 323  # past it: no graph
    assert eager_launches(prefill_step("vllm@0.11", 200)) == 323  # the 0.11 card has no pieces
    assert eager_launches(prefill_step("sglang@0.5.23", 900)) == 96  # SGLang: up to the 8192-token chunk
    assert eager_launches(prefill_step("sglang@0.5.23", 900, amd_gpu())) == 323  # breakable graphs on CUDA only


# ---- all-reduce + RMSNorm fusion ---------------------------------------------------------------------


def norms(stage) -> dict[str, tuple[float, float]]:
    return {op.name: (op.time_s, op.bytes) for op in stage.operations if op.name in ("input_norm", "post_attn_norm")}


def test_vllm_033_folds_both_norms_into_the_tp_all_reduce_on_hopper_up_to_2_mib():
    # Llama-3.1-70B TP4, 32 requests per GPU: the scheduler's 128 tokens all-reduce 128 x 8192 x 2 B = 2 MiB,
    # the H100 TP4 limit (FI_ALLREDUCE_FUSION_MAX_SIZE_MB[90][4] = 2): both norms go
    fused, unfused = decode_step("vllm@0.33", "llama-3.1-70b", 4, 32), decode_step("vllm@0.15", "llama-3.1-70b", 4, 32)
    removed_bytes = 4 * 128 * 8192 * 2 * 80  # residual add + RMSNorm: read x and residual, write both, 80 layers
    for name in ("input_norm", "post_attn_norm"):
        assert norms(fused)[name] == (0.0, 0.0)
        assert norms(unfused)[name][1] == pytest.approx(removed_bytes)
    removed_s = sum(t for t, _ in norms(unfused).values())
    # the rest of the step is the same but for the 15th kernel 0.33 runs outside its graph
    assert unfused.step_time_s - fused.step_time_s == pytest.approx(removed_s - KERNEL)
    # 33 per GPU is 132 tokens, 2.16 MB: past the limit, nothing is folded
    assert all(t > 0 for t, _ in norms(decode_step("vllm@0.33", "llama-3.1-70b", 4, 33)).values())
    # not on A100 (compute capability 8.0), not without an all-reduce (TP1)
    assert all(t > 0 for t, _ in norms(decode_step("vllm@0.33", "llama-3.1-70b", 4, 8, "a100")).values())
    assert all(t > 0 for t, _ in norms(decode_step("vllm@0.33", "llama-3.1-8b", 1, 8)).values())


# ---- card mistakes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(vendors=[]), "vendors"),
    (lambda d: d.update(vendors=["nvidia", "nvidia"]), "vendors"),
    (lambda d: d["fusion_passes"][0].update(operations=["post_atn_norm"]), "fusion_passes[0].operations[0]"),
    (lambda d: d["fusion_passes"][0].update(below_compute_capability=9.0), "fusion_passes[0]"),
    (lambda d: d["overheads"].update(cuda_graph_max_batch=[{"min_gpu_bytes": 0, "value": 8}]),
     "overheads.cuda_graph_max_batch"),
    (lambda d: d["overheads"].update(graph_break_operations=["attention"]), "overheads.graph_break_operations[0]"),
    (lambda d: d.update(vendors=["nvidia"]), "attention_backends["),
])
def test_engine_card_mistakes_are_refused_on_load(edit, field):
    data = raw_card("vllm-0.33")
    edit(data)
    with pytest.raises(ConfigError) as err:
        validate_engine(build(EngineCard, data, "card.yaml"), "card.yaml")
    assert f"field '{field}" in str(err.value)
