import copy, yaml, math
from hypothesis import given, settings, HealthCheck, strategies as st
import pytest
from conftest import REPO_ROOT
from test_hostile_properties import NUMBERS, FIELDS, set_path, check_result, check_error, _card
from infersim.config import config_from_mapping
from infersim.errors import InferSimError
from infersim.simulate import simulate

EXTRA = ["speculative.lookahead", "speculative.acceptance_rate", "speculative.max_lookahead",
         "workload.decode_batch_per_gpu", "hardware.usd_per_gpu_hour", "hardware.derates.deepep_normal_latency",
         "hardware.derates.pcie_efficiency", "hardware.peak.flops.fp8", "hardware.derates.compute_efficiency.fp8"]

@pytest.mark.parametrize("cfg", ["deepseek-v3.2.yaml", "qwen3-next.yaml", "gpt-oss-120b.yaml", "qwen3-8b-speculative.yaml"])
@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS + EXTRA), NUMBERS), min_size=1, max_size=3))
def test_fuzz(cfg, changes):
    run = yaml.safe_load((REPO_ROOT / "configs" / cfg).read_text())
    run["model"] = copy.deepcopy(_card("models", run["model"]))
    run["hardware"] = copy.deepcopy(_card("hardware", run["hardware"]))
    for path, value in changes:
        if path.startswith("speculative.") and "speculative" not in run:
            run["speculative"] = {"method": "mtp", "lookahead": 1, "acceptance_rate": 0.8} if "deepseek" in cfg else {"method": "draft", "draft_model": "qwen3-0.6b", "acceptance_rate": 0.7}
        set_path(run, path, value)
    try:
        result = simulate(config_from_mapping(run, "generated", base=REPO_ROOT / "configs"))
    except InferSimError as exc:
        check_error(exc, changes)
        return
    check_result(result)
