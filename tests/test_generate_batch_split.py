"""How `generate` splits its batch: over the attention-DP replicas only (each runs its own equal
share), a batch that does not divide over them refused naming them; an attention-TP group runs any
number of sequences (its GPUs split heads, not sequences)."""

from __future__ import annotations

import json

import pytest
from test_hostile_cli import one_line_error, run

GENERATE = ("generate", "--model", "llama-3.1-8b", "--hardware", "h100", "--prompt-len", "64", "--gen-len", "4")


def test_a_batch_that_does_not_split_over_the_dp_replicas_is_refused(capsys):
    code, out, err = run(capsys, *GENERATE, "--tp", "1", "--dp-attention", "2", "--batch", "3")
    assert code == 2 and out == ""
    one_line_error(err, "field 'generate.batch' (value: 3)", "2 attention-DP replicas (deployment.attention.dp)",
                   "give a multiple of 2")


def test_the_dp_split_is_named_before_the_per_gpu_one(capsys):
    code, _, err = run(capsys, *GENERATE, "--tp", "2", "--dp-attention", "2", "--batch", "5")
    assert code == 2
    one_line_error(err, "field 'generate.batch' (value: 5)", "2 attention-DP replicas")


def test_a_tp_group_runs_any_batch_and_says_what_is_rounded(capsys):
    code, out, err = run(capsys, *GENERATE, "--tp", "2", "--batch", "3", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["batch"] == 3
    # attention runs the 3 sequences; each GPU's GEMMs carry whole rows: 2 per GPU, 4 in the group
    assert any("runs 3 of the batch's sequences" in note and "4 rows per decode step" in note
               for note in result["notes"]), result["notes"]
    code, out, err = run(capsys, *GENERATE, "--tp", "2", "--batch", "4", "--format", "json")
    assert code == 0 and not any("of the batch's sequences" in note for note in json.loads(out)["notes"])


def test_the_kv_cache_holds_the_replicas_sequences(capsys):
    sizes = {}
    for batch in ("3", "4"):
        code, out, err = run(capsys, *GENERATE, "--tp", "2", "--batch", batch, "--format", "json")
        assert code == 0, err
        sizes[batch] = json.loads(out)["cache_size_gb"]
    assert sizes["3"] * 4 == pytest.approx(sizes["4"] * 3)


def test_batches_that_divide_run(capsys):
    for layout, batch in ((("--tp", "2"), "4"), (("--tp", "2", "--dp-attention", "2"), "8"),
                          (("--tp", "1", "--dp-attention", "2"), "6")):
        code, out, err = run(capsys, *GENERATE, *layout, "--batch", batch, "--format", "json")
        assert code == 0, err
        assert json.loads(out)["batch"] == int(batch)
