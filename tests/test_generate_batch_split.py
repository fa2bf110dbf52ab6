"""How `generate` splits its batch: over the attention-DP replicas (each runs its own equal share),
a batch that does not divide over them refused naming them; and, while the simulation prices one
GPU's equal share, over every GPU of an attention-TP group, refused saying so."""

from __future__ import annotations

import json

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


def test_a_batch_over_a_tp_group_says_why_it_must_divide(capsys):
    code, out, err = run(capsys, *GENERATE, "--tp", "2", "--batch", "3")
    assert code == 2 and out == ""
    one_line_error(err, "field 'generate.batch' (value: 3)", "deployment.num_gpus (2)",
                   "attention-TP group of 2 GPUs (deployment.attention.tp)", "give a multiple of 2")


def test_batches_that_divide_run(capsys):
    for layout, batch in ((("--tp", "2"), "4"), (("--tp", "2", "--dp-attention", "2"), "8"),
                          (("--tp", "1", "--dp-attention", "2"), "6")):
        code, out, err = run(capsys, *GENERATE, *layout, "--batch", batch, "--format", "json")
        assert code == 0, err
        assert json.loads(out)["batch"] == int(batch)
