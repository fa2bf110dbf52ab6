"""calibrate's inputs, refused where they are: a benchmark result of another model than --config's,
and a value the simulation cannot take (a reference's `max_num_seqs: 0`, a result's `completed: 1e9`)
named by its file, key and value, before any run is simulated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import error_of
from conftest import REPO_ROOT

from infersim.base.errors import InferSimError
from infersim.calibrate.data import load_bench_results, load_reference

EXAMPLE = REPO_ROOT / "infersim" / "calibrate" / "examples" / "vllm-h100-runs.yaml"
RESULT = REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json"
FIRST = "62 / 62-mistral-nemo-12b-tp2-general-lite-2-1"  # the example's first experiment


@pytest.fixture()
def vllm_config(tmp_path: Path) -> Path:
    """The bundled Llama-3.1-8B serving config on vLLM, the engine the example result ran."""
    config = yaml.safe_load((REPO_ROOT / "configs" / "serve-llama-8b-h100.yaml").read_text())
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump({**config, "engine": "vllm@0.15"}))
    return path


def _result(tmp_path: Path, **changed: Any) -> Path:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**json.loads(RESULT.read_text()), **changed}))
    return path


# -- the result's model against the config's ---------------------------------------------------------


@pytest.mark.parametrize("model_id, card, how", [
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", "the checkpoint Qwen/Qwen2.5-7B-Instruct of bundled card qwen2.5-7b"),
    ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", "of bundled card llama-3.1-70b"),
])
def test_a_result_of_another_model_than_the_config_is_refused(tmp_path: Path, vllm_config: Path, model_id: str,
                                                               card: str, how: str) -> None:
    result = _result(tmp_path, model_id=model_id)
    with pytest.raises(InferSimError) as caught:
        load_bench_results([result], str(vllm_config))
    message = str(caught.value)
    assert message.startswith(f"{result}: line 1: the result's model_id '{model_id}' names the bundled model {card} ")
    assert how in message
    assert message.endswith(f"but --config {vllm_config} runs llama-3.1-8b (checkpoint meta-llama/Llama-3.1-8B-Instruct)"
                            ": give a config of the model the benchmark served")


def test_the_model_refusal_is_one_line_on_the_command_line(tmp_path: Path, vllm_config: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    result = _result(tmp_path, model_id="Qwen/Qwen2.5-7B-Instruct")
    err = error_of(capsys, "calibrate", "--bench-result", str(result), "--config", str(vllm_config))
    assert f"{result}: line 1: the result's model_id 'Qwen/Qwen2.5-7B-Instruct' names the bundled model qwen2.5-7b" in err


@pytest.mark.parametrize("model_id", [
    "meta-llama/Llama-3.1-8B-Instruct",  # the card's checkpoint
    "nvidia/Llama-3.1-8B-Instruct-FP8",  # its quantised checkpoint
    "/models/Llama-3.1-8B-Instruct",  # a path on the server, named by its last part
    "Llama-3.1-8B",  # the card's name spelled otherwise
    "/data/checkpoints/run-7/step-1000",  # no bundled card answers to it: not told apart
])
def test_a_result_of_the_configs_model_or_of_one_not_told_apart_is_used(tmp_path: Path, vllm_config: Path,
                                                                         model_id: str) -> None:
    (experiment,) = load_bench_results([_result(tmp_path, model_id=model_id)], str(vllm_config))
    assert experiment.model == model_id


# -- values named by their file, key and value -------------------------------------------------------


def test_a_result_completing_more_requests_than_a_run_simulates_is_named(tmp_path: Path, vllm_config: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    result = _result(tmp_path, completed=1e9, num_prompts=1e9)
    err = error_of(capsys, "calibrate", "--bench-result", str(result), "--config", str(vllm_config))
    assert err.startswith(f"infersim: error: {result}: line 1: field 'completed' (value: 1000000000.0): more than the "
                          "10,000,000 requests a serving run simulates")


@pytest.mark.parametrize("command", [["calibrate", "--config"], ["compare", "--config"]])
def test_compare_and_calibrate_refuse_the_same_results(tmp_path: Path, vllm_config: Path, command: list[str],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Both read results through one parser: too many completed requests, or more completed than sent."""
    too_many = _result(tmp_path, completed=1e9, num_prompts=1e9)
    err = error_of(capsys, command[0], "--bench-result", str(too_many), command[1], str(vllm_config))
    assert f"{too_many}: line 1: field 'completed' (value: 1000000000.0): more than the 10,000,000" in err
    more_than_sent = _result(tmp_path, completed=600, num_prompts=500)
    err = error_of(capsys, command[0], "--bench-result", str(more_than_sent), command[1], str(vllm_config))
    assert (f"{more_than_sent}: line 1: field 'num_prompts' (value: 500): fewer requests sent than the 600 completed"
            in err)


def test_a_result_whose_load_the_simulation_refuses_is_named(tmp_path: Path, vllm_config: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A rate whose arrivals span more than the serving clock resolves: the message the simulation
    gives, with the result it came from."""
    result = _result(tmp_path, request_rate=1e-12)
    err = error_of(capsys, "calibrate", "--bench-result", str(result), "--config", str(vllm_config))
    assert err.startswith(f"infersim: error: {result}: line 1: 500 requests at 1e-12 req/s spans")


def _reference(tmp_path: Path, old: str, new: str) -> Path:
    text = EXAMPLE.read_text()
    assert old in text
    path = tmp_path / "runs.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_a_reference_with_max_num_seqs_0_is_named_on_the_command_line(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    reference = _reference(tmp_path, "max_num_seqs: 128", "max_num_seqs: 0")
    err = error_of(capsys, "calibrate", "--reference", str(reference), "--hardware", "h100-sxm", "--engine",
                   "vllm@0.15")
    assert err == (f"infersim: error: {reference}: experiment {FIRST}: field 'vllm.max_num_seqs' (value: 0): "
                   "must be at least 1")


@pytest.mark.parametrize("old, new, named", [
    ("max_num_seqs: 128", "max_num_seqs: 1.5", "field 'vllm.max_num_seqs' (value: 1.5): expected a whole number"),
    ("gpu_kv_cache_blocks: 48009", "gpu_kv_cache_blocks: 1e30",
     "field 'vllm.gpu_kv_cache_blocks' (value: '1e30'): too large"),
    ("cpu_kv_offload_blocks: 6553", "cpu_kv_offload_blocks: -1", "field 'vllm.cpu_kv_offload_blocks' (value: -1)"),
    ("max_num_batched_tokens: 1024", "max_num_batched_tokens: true",
     "field 'vllm.max_num_batched_tokens' (value: True): expected a whole number"),
    ("max_position_embeddings: 131072", "max_position_embeddings: lots",
     "field 'hf_config.max_position_embeddings' (value: 'lots'): expected a whole number"),
    ("question_len: 447", "question_len: 0", "field 'workload.question_len' (value: 0): must be at least 1"),
    ("num_unique_system_prompts: 9", "num_unique_system_prompts: 0",
     "field 'workload.num_unique_system_prompts' (value: 0)"),
    ("rate_rps: 2.5, duration_s: 600}", "rate_rps: 2.5, duration_s: ten}",
     "field 'workload.stages[0].duration_s' (value: 'ten'): expected a number"),
    ("rate_rps: 2.5,", "rate_rps: -2.5,", "field 'workload.stages[0].rate_rps' (value: -2.5): must be greater than 0"),
    ("rate_rps: 2.5,", "rate_rps: 1.0e-20,", "workload.load.stages[0]: 0 requests"),  # read as the simulation reads it
    ("tp: 2", "tp: 0", "tp: expected a whole number of GPUs (got 0)"),
    ("ttft_mean_ms: ", "ttft_mean_ms: -", "measured.stage_0.ttft_mean_ms: expected a positive number of ms"),
])
def test_a_reference_value_is_named_by_file_experiment_and_key(tmp_path: Path, old: str, new: str, named: str) -> None:
    reference = _reference(tmp_path, old, new)
    with pytest.raises(InferSimError) as caught:
        load_reference([reference], "h100-sxm", "vllm@0.15", 120.0)
    assert str(caught.value).startswith(f"{reference}: experiment {FIRST}: {named}"), str(caught.value)


def test_a_run_whose_requests_are_all_rejected_says_why(tmp_path: Path, vllm_config: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    completed = json.loads(RESULT.read_text())["completed"]
    # 200,000 + 200 tokens per request: longer than Llama-3.1-8B's 131,072-token context, which vLLM refuses
    result = _result(tmp_path, total_input_tokens=200_000 * completed, total_output_tokens=200 * completed)
    err = error_of(capsys, "calibrate", "--bench-result", str(result), "--config", str(vllm_config), code=1)
    assert "no request completed" in err and "context of 131,072 tokens were rejected on arrival" in err
