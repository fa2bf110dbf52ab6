"""compare --bench-result simulates the model the result served, and says when the simulated server
refuses the requests the benchmark completed (it used to print a column of zeros)."""

from __future__ import annotations

import json

from conftest import REPO_ROOT
from test_hostile_cli import one_line_error, run

RESULT = REPO_ROOT / "docs" / "examples" / "vllm-bench-serve-llama-3.1-8b-h100-rate8.json"


def _result(tmp_path, **changes):
    data = json.loads(RESULT.read_text())
    data.update(changes)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_result_of_another_bundled_model_is_refused(capsys, tmp_path):
    code, out, err = run(capsys, "compare", "--bench-result", _result(tmp_path), "--hardware", "h100-sxm",
                         "--model", "llama-2-7b")
    assert code == 2 and not out
    one_line_error(err, "model_id 'meta-llama/Llama-3.1-8B-Instruct' names the bundled model llama-3.1-8b",
                   "the simulated run is of llama-2-7b", "--model llama-3.1-8b")


def test_requests_the_simulated_server_rejects_are_said(capsys, tmp_path):
    # 6,000 + 200 tokens per request: longer than Llama-2-7B's 4,096-token context, which vLLM refuses
    data = json.loads(RESULT.read_text())
    path = _result(tmp_path, model_id="meta-llama/Llama-2-7b-hf", tokenizer_id="meta-llama/Llama-2-7b-hf",
                   total_input_tokens=6000 * data["completed"], total_output_tokens=200 * data["completed"])
    code, out, err = run(capsys, "compare", "--bench-result", path, "--hardware", "h100-sxm",
                         "--model", "llama-2-7b")
    assert code == 1 and not out
    one_line_error(err, f"the simulated server rejected all {data['completed']:,} requests on arrival",
                   "longer (prompt + output) than model llama-2-7b's context of 4,096 tokens")
