"""Bundled kernel tables chosen by device and engine framework (infersim.tables.select), and the
bundled aiconfigurator tables themselves: they load, carry the licence notice and serve the shapes
of the dense models the batch-1 prefill check uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from infersim.shapes.kernels import AttentionShape, GemmShape
from infersim.tables.lookup import load_tables
from infersim.tables.select import TableChoice, bundled_tables_for

BUNDLED = Path(__file__).resolve().parent.parent / "mfu_tables"
AIC_DEVICES = ("h100-sxm", "h200", "b200", "gb200", "b300", "gb300", "l40s", "rtx-pro-6000")
#: aiconfigurator's current version of each engine (its query_versions.yaml), and on its A100
CURRENT = {"trtllm": "1.3.0rc20", "sglang": "0.5.14", "vllm": "0.24.0"}
A100_CURRENT = {"trtllm": "1.0.0", "sglang": "0.5.10", "vllm": "0.14.0"}


def make_root(tmp_path: Path, dirs: list[str]) -> Path:
    for rel in dirs:
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "provenance.yaml").write_text("format_version: 1\n")
    return tmp_path


def test_same_device_and_framework_newest_version(tmp_path: Path) -> None:
    root = make_root(tmp_path, ["aiconfigurator/h100-sxm/trtllm-1.2.0rc5", "aiconfigurator/h100-sxm/trtllm-1.3.0rc20",
                                "aiconfigurator/h100-sxm/trtllm-1.3.0", "aiconfigurator/h100-sxm/sglang-0.5.14",
                                "aiconfigurator/h200/trtllm-1.3.0rc20"])
    choice = bundled_tables_for("h100-sxm", "trtllm", root)
    assert choice == TableChoice(root / "aiconfigurator/h100-sxm/trtllm-1.3.0", "trtllm", "1.3.0",
                                 "kernel tables for h100-sxm and engine trtllm: trtllm 1.3.0 (h100-sxm/trtllm-1.3.0); "
                                 "other versions bundled: 1.3.0rc20, 1.2.0rc5")
    assert bundled_tables_for("h100-sxm", "sglang", root).path == root / "aiconfigurator/h100-sxm/sglang-0.5.14"


def test_fallback_to_another_framework_says_so(tmp_path: Path) -> None:
    root = make_root(tmp_path, ["aiconfigurator/h100-sxm/vllm-0.24.0", "aiconfigurator/h100-sxm/sglang-0.5.14",
                                "imported/h20"])
    choice = bundled_tables_for("h100-sxm", "trtllm", root)
    assert choice is not None and choice.framework == "sglang"
    assert choice.note == ("kernel tables for h100-sxm: no trtllm tables bundled for h100-sxm; took sglang 0.5.14 "
                           "(h100-sxm/sglang-0.5.14) instead: kernel times are those of another engine's kernels")
    none_given = bundled_tables_for("h100-sxm", None, root)
    assert none_given.path == root / "aiconfigurator/h100-sxm/sglang-0.5.14"
    assert none_given.note.endswith("no engine given; took sglang 0.5.14 (h100-sxm/sglang-0.5.14)")
    # the original InferSim's imported tables are SGLang-class kernels
    h20 = bundled_tables_for("h20", "sglang", root)
    assert h20 == TableChoice(root / "imported/h20", "sglang", "unknown",
                              "kernel tables for h20 and engine sglang: sglang-class kernels (imported/h20)")
    assert bundled_tables_for("h20", "vllm", root).path == root / "imported/h20"
    assert bundled_tables_for("a100-sxm-80g", "trtllm", root) is None


def test_directories_without_provenance_are_not_candidates(tmp_path: Path) -> None:
    (tmp_path / "aiconfigurator/h200/trtllm-1.3.0rc20").mkdir(parents=True)
    assert bundled_tables_for("h200", "trtllm", tmp_path) is None


@pytest.mark.parametrize("device", AIC_DEVICES + ("a100-sxm-80g",))
@pytest.mark.parametrize("framework", ("trtllm", "sglang", "vllm"))
def test_each_engine_takes_its_own_bundled_tables(device: str, framework: str) -> None:
    version = (A100_CURRENT if device == "a100-sxm-80g" else CURRENT)[framework]
    choice = bundled_tables_for(device, framework)
    assert choice is not None and choice.path == BUNDLED / "aiconfigurator" / device / f"{framework}-{version}"
    assert choice.note == (f"kernel tables for {device} and engine {framework}: {framework} {version} "
                           f"({device}/{framework}-{version})")


def test_bundled_choices() -> None:
    assert bundled_tables_for("h800", "trtllm").path == BUNDLED / "imported" / "h800"
    assert bundled_tables_for("rtx-a6000", "vllm") is None
    # aiconfigurator measured an A100-SXM4-80GB: the 40GB card (HBM2 at 1,555 of 2,039 GB/s) gets none
    assert bundled_tables_for("a100-sxm-40g", "vllm") is None
    # an engine without tables of its own on a device takes another engine's, and says so
    h20 = bundled_tables_for("h20", "vllm")
    assert h20 is not None and h20.framework == "sglang"
    assert "no vllm tables bundled for h20; took sglang-class kernels (imported/h20) instead" in h20.note


@pytest.mark.parametrize("device", AIC_DEVICES + ("a100-sxm-80g",))
def test_bundled_provenance_names_its_gpu_and_licence(device: str) -> None:
    from infersim.tables.lookup import same_device
    from infersim.tables.table_files import read_provenance

    for directory in sorted((BUNDLED / "aiconfigurator" / device).iterdir()):
        prov = read_provenance(directory)
        assert prov.source["license"] == "Apache-2.0" and prov.notes[0].startswith("Apache-2.0")
        assert prov.software["package"] == "aiconfigurator-core"
        assert f"{prov.software['framework']}-{prov.software['framework_version']}" == directory.name
        assert same_device(prov.device.name, device), (directory, prov.device.name)
        assert all(name.endswith(".csv.gz") for name in prov.tables)
    if device == "a100-sxm-80g":
        assert prov.device.name == "NVIDIA A100-SXM4-80GB"


#: indexing a bundled table set from its CSVs takes ~5 CPU-s, ~150 s for all of them: the default run
#: checks the smallest bundle; `-m slow`, all
CHECKED_BY_DEFAULT = ("a100-sxm-80g",)


@pytest.mark.parametrize("device", [device if device in CHECKED_BY_DEFAULT else pytest.param(device, marks=pytest.mark.slow)
                                    for device in AIC_DEVICES + ("a100-sxm-80g",)])
def test_bundled_tables_load_and_pass_their_cards_checks(device: str) -> None:
    """No bundled row is faster than its card's peak FLOP/s (checked on load) or HBM bandwidth:
    a run on that GPU is never refused for its own tables."""
    from infersim.run.config import load_hardware_card

    card = load_hardware_card(device)[0]
    for directory in sorted((BUNDLED / "aiconfigurator" / device).iterdir()):
        load_tables(directory).check_hardware(card)


@pytest.mark.parametrize("device", ("h100-sxm", pytest.param("b200", marks=pytest.mark.slow)))
def test_bundled_aiconfigurator_tables_load_with_licence(device: str) -> None:
    tables = load_tables(BUNDLED / "aiconfigurator" / device / "trtllm-1.3.0rc20")
    prov = tables.provenance
    assert prov.source["license"] == "Apache-2.0" and prov.notes[0].startswith("Apache-2.0")
    assert prov.software["framework"] == "trtllm" and prov.software["package"] == "aiconfigurator-core"
    assert tables.moe_includes_imbalance


def test_bundled_h100_tables_serve_llama_2_7b_prefill() -> None:
    """Llama-2-7B at TP1: QKV (4096 x 12288) and O are measured (K, N); the MLP's 11008 lies between
    measured K and N and is interpolated; attention 32-32-128 prefill at 4096 tokens is a grid point
    the bundle kept."""
    tables = load_tables(BUNDLED / "aiconfigurator" / "h100-sxm" / "trtllm-1.3.0rc20")
    peak = tables.provenance.peak_flops["bf16"]
    qkv = tables.lookup(GemmShape(m=4096, k=4096, n=12288), peak)
    # measured 515.227 us (the full conversion); the bundle left m = 4096 out because 4097 and 3840
    # around it reproduce it within the thinning's 3%: 519.6 us
    assert qkv is not None and qkv.method == "interpolated"
    assert qkv.seconds == pytest.approx(515.2266820e-6, rel=0.03)
    down = tables.lookup(GemmShape(m=4096, k=11008, n=4096), peak)
    assert down is not None and down.method == "interpolated" and "k=11008 between 10240 and 12288" in down.note
    attention = tables.lookup(AttentionShape(kind="mha", stage="prefill", batch=1, q_len=4096, kv_len=4096,
                                             num_heads=32, num_kv_heads=32, qk_head_dim=128, v_head_dim=128,
                                             causal=True, dtype="bf16", kv_dtype="bf16"), peak)
    assert attention is not None and attention.method == "exact"


def test_decode_attention_beyond_the_measured_kv_heads_is_the_same_work_items() -> None:
    """vLLM's H100 tables measure decode attention up to 8 KV heads per GPU; Llama-2-7B's MHA (32 of
    32) reads as the 8-of-8 kernel at four times the batch: the same (sequence, KV head) items over
    the same bytes, so the same time, and its FLOP efficiency is that time's."""
    tables = load_tables(BUNDLED / "aiconfigurator" / "h100-sxm" / "vllm-0.24.0")
    peak = tables.provenance.peak_flops["bf16"]

    def decode(batch: int, heads: int, kv_heads: int) -> AttentionShape:
        return AttentionShape(kind="mha", stage="decode", batch=batch, q_len=1, kv_len=1758, num_heads=heads,
                              num_kv_heads=kv_heads, qk_head_dim=128, v_head_dim=128, causal=True, dtype="bf16",
                              kv_dtype="bf16")

    mha = tables.lookup(decode(17, 32, 32), peak)
    eight = tables.lookup(decode(68, 8, 8), peak)
    assert mha is not None and eight is not None
    assert mha.seconds == eight.seconds and mha.method == eight.method
    assert mha.efficiency == pytest.approx(decode(17, 32, 32).flops / (mha.seconds * peak), rel=1e-12)
    assert mha.note.startswith("32 KV heads beyond the table's: its 8-KV-head kernel at batch 68")


def test_decode_attention_of_an_unmeasured_group_size_lies_between_its_neighbours() -> None:
    """Qwen2.5-7B's 28 query heads over 4 KV heads (7 per KV head): vLLM's H100 table measured groups
    6 and 8 at 4 KV heads, so the kernel is read between them, linear in the group size (7 is half way
    from 6 to 8: the mean of the two). A group above the largest measured one (128 of 1)
    has no answer."""
    tables = load_tables(BUNDLED / "aiconfigurator" / "h100-sxm" / "vllm-0.24.0")
    peak = tables.provenance.peak_flops["bf16"]

    def decode(heads: int, kv_heads: int, batch: int = 10) -> AttentionShape:
        return AttentionShape(kind="mha", stage="decode", batch=batch, q_len=1, kv_len=1750, num_heads=heads,
                              num_kv_heads=kv_heads, qk_head_dim=128, v_head_dim=128, causal=True, dtype="bf16",
                              kv_dtype="bf16")

    six, seven, eight = (tables.lookup(decode(g * 4, 4), peak) for g in (6, 7, 8))
    assert six is not None and seven is not None and eight is not None
    assert seven.seconds == pytest.approx((six.seconds + eight.seconds) / 2, rel=1e-12)
    assert seven.method == "interpolated"
    assert seven.efficiency == pytest.approx(decode(28, 4).flops / (seven.seconds * peak), rel=1e-12)
    assert seven.note.startswith("7 query heads per KV head between the table's 6 and 8")
    assert tables.lookup(decode(128, 1), peak) is None


def test_report_line_names_engine_and_routing() -> None:
    tables = load_tables(BUNDLED / "aiconfigurator" / "h100-sxm" / "trtllm-1.3.0rc20")  # the set the tests above index
    line = tables.describe()
    assert "engine trtllm 1.3.0rc20" in line
    assert ("MoE tables timed under power_law_1.01, power_law_1.2 routing: expert-load imbalance included; "
            "elementwise kernels at 0.80 of HBM bandwidth + 3 us each (aiconfigurator's rule for memory-bound "
            "ops: systems/h100_sxm.yaml mem_bw_empirical_scaling_factor 0.8 + mem_empirical_constant_latency "
            "3e-06 s per op") in line


# ---------------------------------------------------------------------------------------------
# Tables measured with PyTorch's own kernels (mfu_tables/measured/<device>/torch-<version>/)

FIXTURE_ROOT = Path(__file__).resolve().parent / "data" / "mfu_root"


def test_hf_engines_take_the_newest_measured_torch_tables() -> None:
    choice = bundled_tables_for("h100-sxm", "huggingface", FIXTURE_ROOT)
    assert choice == TableChoice(FIXTURE_ROOT / "measured/h100-sxm/torch-2.11.0", "torch", "2.11.0",
                                 "kernel tables for h100-sxm and engine huggingface: measured with PyTorch 2.11.0's own "
                                 "kernels, as huggingface runs them (measured/h100-sxm/torch-2.11.0); other versions "
                                 "bundled: 2.10.0")
    # other engines do not run PyTorch's kernels: measured tables are only their last resort
    assert bundled_tables_for("h100-sxm", "trtllm", FIXTURE_ROOT).framework == "torch"
    assert "another engine's kernels" in bundled_tables_for("h100-sxm", "trtllm", FIXTURE_ROOT).note


def test_without_measured_tables_the_hf_fallback_says_what_is_missing(tmp_path: Path) -> None:
    root = make_root(tmp_path, ["aiconfigurator/h100-sxm/trtllm-1.3.0rc20"])
    choice = bundled_tables_for("h100-sxm", "huggingface", root)
    assert choice.framework == "trtllm"
    assert choice.note == (
        "kernel tables for h100-sxm: no tables measured with PyTorch's own kernels are bundled for h100-sxm "
        "(mfu_tables/measured/h100-sxm/torch-<version>/, written by `infersim mfu bench` on that GPU); took trtllm "
        "1.3.0rc20 (h100-sxm/trtllm-1.3.0rc20) instead: kernel times are another engine's kernels, not the cuBLAS, "
        "SDPA and eager elementwise kernels huggingface runs")
    # today's bundle: none measured yet, so an HF run says so
    assert "no tables measured with PyTorch's own kernels" in bundled_tables_for("h100-sxm", "huggingface").note


def test_a_run_uses_the_measured_tables_and_their_host_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    import infersim.tables.select as select
    from infersim.run.config import config_from_mapping
    from infersim.shapes.kernels import elementwise_shape
    from infersim.costing.timing import kernel_cost

    monkeypatch.setattr(select, "bundled_dir", lambda kind: FIXTURE_ROOT)
    run = {"model": "llama-2-7b", "hardware": "h100-sxm", "engine": "huggingface",
           "deployment": {"num_gpus": 1}, "workload": {"isl": 128, "osl": 16, "decode_batch_per_gpu": 1}}
    config = config_from_mapping(run, "test")
    assert config.tables.provenance.command.startswith("hand-written fixture")
    assert config.engine.overheads.launch_cpu == pytest.approx(12e-6)
    assert config.engine.overheads.step_cpu == pytest.approx(1.5e-3)
    assert "measured with PyTorch 2.11.0's own kernels" in config.tables_note
    assert "host costs measured with the kernel tables: launch_cpu 12.0 us" in config.tables_note
    # an eager elementwise kernel is priced from the table: between 4096 and 1M elements, linear in bytes
    add = elementwise_shape("add", "bf16", 1 << 19)
    cost = kernel_cost(add, config.hardware, config.tables)
    assert cost.source.value == "table"
    assert cost.seconds == pytest.approx((2.5 + (4.0 - 2.5) * ((1 << 19) - 4096) / ((1 << 20) - 4096)) * 1e-6)
    # an engine that does not take host costs from tables keeps its card's
    sglang = config_from_mapping({**run, "engine": "sglang", "mfu_tables": str(FIXTURE_ROOT /
                                                                                "measured/h100-sxm/torch-2.11.0")},
                                 "test")
    assert sglang.engine.overheads.launch_cpu == pytest.approx(6e-6)
