"""An inference-perf profile's bad values and unread keys are refused naming the file, key and value."""

from __future__ import annotations

from typing import Any

import pytest

from infersim.base.errors import InferSimError
from infersim.serve.inference_perf import workload_from_inference_perf

SOURCE = "inference-perf profile p.yaml"
CONSTANT = {"type": "constant", "stages": [{"rate": 2, "duration": 5}]}


def profile(data: dict[str, Any] | None = None, load: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"load": load if load is not None else CONSTANT,
            "data": data if data is not None else {"type": "random", "input_distribution": 20,
                                                   "output_distribution": 20}}


def random_input(dist: Any) -> dict[str, Any]:
    return profile({"type": "random", "input_distribution": dist, "output_distribution": 20})


def shared(**keys: Any) -> dict[str, Any]:
    return profile({"type": "shared_prefix", "shared_prefix": keys})


def refused(p: dict[str, Any], *parts: str) -> None:
    with pytest.raises(InferSimError) as caught:
        workload_from_inference_perf(p, SOURCE)
    message = str(caught.value)
    assert message.startswith(SOURCE), message
    for part in parts:
        assert part in message, message


@pytest.mark.parametrize("dist, key, shown", [
    ({"type": "fixed", "mean": float("inf")}, "input_distribution.mean", "inf"),
    ({"type": "fixed", "mean": float("nan")}, "input_distribution.mean", "nan"),
    ({"type": "fixed", "mean": "12x"}, "input_distribution.mean", "'12x'"),
    ({"type": "fixed", "mean": 0.5}, "input_distribution.mean", "0.5"),
    ({"type": "normal", "mean": 100, "variance": -4}, "input_distribution.variance", "-4"),
    ({"type": "normal", "mean": 100, "variance": "abc"}, "input_distribution.variance", "'abc'"),
    ({"type": "poisson", "mean": "abc"}, "input_distribution.mean", "'abc'"),
    ({"type": "normal", "mean": 100, "min": 1.5}, "input_distribution.min", "1.5"),
    ({"type": "normal", "mean": 100, "std_dev": True}, "input_distribution.std_dev", "True"),
    (2.5, "input_distribution", "2.5"),
    ("many", "input_distribution", "'many'"),
])
def test_bad_distribution_numbers_name_key_and_value(dist: Any, key: str, shown: str) -> None:
    refused(random_input(dist), key, shown)


def test_a_load_type_that_is_not_text_is_refused() -> None:
    refused(profile(load={"type": ["constant"], "stages": [{"rate": 2, "duration": 5}]}), "load.type", "['constant']")


@pytest.mark.parametrize("value", ["false", "no", 0, 1])
def test_multi_turn_must_be_a_boolean(value: Any) -> None:
    refused(shared(enable_multi_turn_chat=value), "enable_multi_turn_chat", "expected true or false")


@pytest.mark.parametrize("load, key", [
    ({"type": "constant", "stages": [{"rate": 2, "duration": 5, "ramp": 4}]}, "load.stages[0].ramp: unknown key"),
    ({"type": "concurrent", "stages": [{"num_requests": 20, "concurrency_level": 4, "rate": 2}]},
     "load.stages[0].rate: not read"),
    ({"type": "constant", "stages": [{"rate": 2, "duration": 5, "num_requests": 4}]},
     "load.stages[0].num_requests: not read"),
    ({"type": "poisson", "stages": [{"rate": 2, "duration": 5, "concurrency_level": 4}]},
     "load.stages[0].concurrency_level: not read"),
    ({"type": "constant", "stages": [{"rate": 2, "duration": 5, "session_rate": 1}]}, "not modelled"),
    ({"type": "constant", "stages": [{"rate": 2}]}, "missing duration"),
    ({"type": "constant", "stages": [{"rate": "fast", "duration": 5}]}, "'load.stages[0].rate' (value: 'fast')"),
    ({"type": "concurrent", "stages": [{"num_requests": 2.5, "concurrency_level": 4}]},
     "'load.stages[0].num_requests' (value: 2.5)"),
    ({"type": "constant", "interval": -1, "stages": [{"rate": 2, "duration": 5}]}, "'load.interval' (value: -1)"),
])
def test_stage_keys_are_read_or_refused(load: dict[str, Any], key: str) -> None:
    refused(profile(load=load), key)


@pytest.mark.parametrize("keys, named", [
    ({"sytem_prompt_len": 5000}, "['sytem_prompt_len']"),
    ({"num_groups": 2, "num_unique_system_prompts": 7}, "give num_groups or num_unique_system_prompts, not both"),
    ({"num_prompts_per_group": 2, "num_users_per_system_prompt": 7}, "not both"),
    ({"question_len": 300, "question_distribution": {"mean": 20}}, "give question_len or question_distribution"),
    ({"output_len": {"mean": 30}, "output_distribution": {"mean": 20}}, "give output_len or output_distribution"),
    ({"num_groups": "two"}, "'data.shared_prefix.num_groups' (value: 'two')"),
    ({"num_unique_system_prompts": 0}, "'data.shared_prefix.num_unique_system_prompts' (value: 0)"),
])
def test_shared_prefix_keys_are_read_or_refused(keys: dict[str, Any], named: str) -> None:
    refused(shared(**keys), named)


@pytest.mark.parametrize("p, named", [
    (profile(data={}), "data.type 'mock'"),
    (profile(load={"type": "constant", "stages": {"rate": 2, "duration": 5}}), "load.stages"),
    (profile(data={"type": "shared_prefix", "shared_prefix": 5}), "data.shared_prefix"),
    (profile(data={"type": "random", "input_distribution": 20}), "input_distribution and output_distribution"),
])
def test_messages_name_the_file(p: dict[str, Any], named: str) -> None:
    refused(p, named)


def test_valid_profiles_read_as_before() -> None:
    form = workload_from_inference_perf(shared(num_unique_system_prompts=9, num_users_per_system_prompt=5,
                                               system_prompt_len=100, question_len=447, output_len=248,
                                               enable_multi_turn_chat=True), SOURCE)
    assert form["data"] == {"type": "shared_prefix", "num_groups": 9, "prompts_per_group": 5, "system_prompt_len": 100,
                            "question_len": 447, "output_len": 248, "multi_turn": True, "order": "cycle"}
    assert form["load"] == {"stages": [{"rate": 2, "duration_s": 5}], "interval_s": 1.0, "timer": "constant"}
    legacy = workload_from_inference_perf(shared(question_distribution={"mean": 20, "std_dev": 5}), SOURCE)
    assert legacy["data"]["question_len"] == {"dist": "normal", "mean": 20, "std": 5, "min": 10, "max": 1024}
    assert legacy["data"]["multi_turn"] is False and legacy["data"]["num_groups"] == 10
    fixed = workload_from_inference_perf(random_input({"type": "fixed", "mean": 50.7}), SOURCE)
    assert fixed["data"]["input"] == 50  # inference-perf sends int(mean) tokens
    closed = workload_from_inference_perf(profile(load={"type": "concurrent", "stages": [
        {"num_requests": 20, "concurrency_level": 4}]}), SOURCE)
    assert closed["load"]["stages"] == [{"concurrency": 4, "num_requests": 20}]


def test_the_other_data_types_keys_are_named_in_the_notes() -> None:
    p = shared(question_len=30)
    p["data"]["input_distribution"] = {"mean": 100}
    notes = " ".join(workload_from_inference_perf(p, SOURCE)["notes"])
    assert "data.input_distribution (not read with data.type shared_prefix)" in notes
