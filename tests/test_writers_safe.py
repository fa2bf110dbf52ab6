"""Writers replace only what they may: never one of the command's own inputs, never a file InferSim
did not write (even with --force), and a path that cannot be written is one line before the work.

Each case drives the command line in process and checks the status, the one line on stderr (naming
the flag and the value) and that every file it must not touch is byte for byte as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import test_aic_import
from test_hostile_cli import one_line_error, run

from infersim.base.errors import InferSimError
from infersim.tables.format import PROVENANCE_FILE

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVE = ("serve", "--config", "serve-llama-8b-h100.yaml")
TRACES = REPO_ROOT / "tests" / "data" / "traces"
FROM_TRACE = ("mfu", "from-trace", str(TRACES / "llama-2-7b-2l-eager-h100-synthesised-p1x128-d2.json.gz"),
              "--config", str(TRACES / "llama-2-7b-2l-p1x128-d2.run.yaml"))
AIC_VERSION = test_aic_import.VERSION
aic_source = test_aic_import.package  # a fixture: a miniature aiconfigurator systems/ directory
HF_CONFIG = {"model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "intermediate_size": 12288,
             "torch_dtype": "bfloat16"}


def snapshot(*paths: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


def unchanged(before: dict[Path, bytes]) -> bool:
    return all(p.read_bytes() == data for p, data in before.items())


# -- an output that is one of the command's inputs


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n0.5,200,20\n")
    return path


@pytest.mark.parametrize("through", ["same", "symlink", "hardlink"])
def test_requests_out_never_replaces_the_trace(capsys, tmp_path, trace, through):
    out = trace
    if through == "symlink":
        out = tmp_path / "link.csv"
        out.symlink_to(trace)
    elif through == "hardlink":
        out = tmp_path / "hard.csv"
        os.link(trace, out)
    before = snapshot(trace)
    code, _, err = run(capsys, *SERVE, "--trace", str(trace), "--requests-out", str(out))
    assert code == 2
    one_line_error(err, f"--requests-out {out}", f"--trace {trace}", "same file")
    assert unchanged(before)


def test_requests_out_beside_the_trace_is_written(capsys, tmp_path, trace):
    out = tmp_path / "records.csv"
    code, _, err = run(capsys, *SERVE, "--trace", str(trace), "--requests-out", str(out))
    assert code == 0, err
    assert out.read_text().startswith("id,arrival_s,input_tokens,output_tokens")
    code, _, err = run(capsys, *SERVE, "--trace", str(trace), "--requests-out", str(tmp_path))
    assert code == 2
    one_line_error(err, f"--requests-out {tmp_path}", "is a directory")


def test_calibrate_out_never_replaces_a_reference(capsys, tmp_path):
    reference = tmp_path / "r.yaml"
    reference.write_bytes((REPO_ROOT / "infersim" / "calibrate" / "examples" / "vllm-h100-runs.yaml").read_bytes())
    before = snapshot(reference)
    code, _, err = run(capsys, "calibrate", "--reference", str(reference), "--out", str(reference),
                       "--hardware", "h100", "--engine", "vllm@0.15")
    assert code == 2
    one_line_error(err, f"--out {reference}", f"--reference {reference}", "same file")
    assert unchanged(before)
    code, _, err = run(capsys, "calibrate", "--reference", str(reference), "--out", str(tmp_path / "no" / "p.yaml"),
                       "--hardware", "h100", "--engine", "vllm@0.15")
    assert code == 2
    one_line_error(err, "--out", "does not exist")


def test_plot_out_never_replaces_the_result(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    result = tmp_path / "run.png"  # a picture name: the format check alone would let it through
    result.write_text(json.dumps({"not": "read"}))
    before = snapshot(result)
    code, _, err = run(capsys, "plot", str(result), "--out", str(result))
    assert code == 2
    one_line_error(err, f"--out {result}", f"RESULT {result}", "same file")
    assert unchanged(before)


# -- --force replaces only what InferSim's own provenance lists


def published_source(root: Path) -> Path:
    """The smallest source `mfu import-infersim` takes: one H20 GEMM table."""
    table = root / "src" / "gemm" / "h20" / "data.csv"
    table.parent.mkdir(parents=True)
    table.write_text("m,k,n,latency_us,mfu\n64,2048,6144,12.5,0.4\n128,2048,6144,15.1,0.6\n")
    return root / "src"


def import_infersim(capsys, source: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "mfu", "import-infersim", str(source), "--out", str(out), "--devices", "h20", *extra)


@pytest.mark.parametrize("name, text", [("gemm.csv", "m,k,n\nmy own measurements\n"),
                                        (PROVENANCE_FILE, "my own provenance notes\n")])
def test_force_never_replaces_a_file_infersim_did_not_write(capsys, tmp_path, name, text):
    source = published_source(tmp_path)
    mine = tmp_path / "out" / "h20" / name
    mine.parent.mkdir(parents=True)
    mine.write_text(text)
    code, _, err = import_infersim(capsys, source, tmp_path / "out", "--force")
    assert code == 2
    one_line_error(err, f"--out {mine.parent}", repr(name), "InferSim did not write")
    assert mine.read_text() == text and sorted(os.listdir(mine.parent)) == [name]


def test_force_replaces_infersims_own_tables_and_leaves_the_rest(capsys, tmp_path):
    source = published_source(tmp_path)
    out = tmp_path / "out"
    assert import_infersim(capsys, source, out)[0] == 0
    notes = out / "h20" / "README.md"
    notes.write_text("my notes\n")
    code, _, err = import_infersim(capsys, source, out)
    assert code == 2
    one_line_error(err, "already holds kernel tables", "--force")
    code, _, err = import_infersim(capsys, source, out, "--force")
    assert code == 0, err
    assert sorted(os.listdir(out / "h20")) == ["README.md", "gemm.csv", PROVENANCE_FILE]
    assert notes.read_text() == "my notes\n"


def test_import_infersim_out_a_file_is_one_line(capsys, tmp_path):
    source = published_source(tmp_path)
    out = tmp_path / "O"
    out.write_text("a file\n")
    code, _, err = import_infersim(capsys, source, out)
    assert code == 2
    one_line_error(err, "--out", str(out), "is not a directory")
    assert out.read_text() == "a file\n"


@pytest.mark.parametrize("name", ["gemm_bf16.csv", PROVENANCE_FILE])
def test_from_trace_force_never_replaces_a_foreign_file(capsys, tmp_path, name):
    mine = tmp_path / "tables" / name
    mine.parent.mkdir()
    mine.write_text("mine\n")
    code, _, err = run(capsys, *FROM_TRACE, "--out", str(mine.parent), "--force")
    assert code == 2
    one_line_error(err, f"--out {mine.parent}", repr(name), "InferSim did not write")
    assert mine.read_text() == "mine\n"


def test_import_aiconfigurator_force_never_replaces_a_foreign_provenance(aic_source, tmp_path):
    from infersim.tabletools import aiconfigurator as aic

    mine = tmp_path / "out" / "h100-sxm" / f"trtllm-{AIC_VERSION}" / PROVENANCE_FILE
    mine.parent.mkdir(parents=True)
    mine.write_text("mine\n")
    with pytest.raises(InferSimError, match="'provenance.yaml', a file InferSim did not write"):
        aic.import_aiconfigurator(tmp_path / "out", "cmd", devices=["h100-sxm"], source=aic_source, force=True)
    assert mine.read_text() == "mine\n"
    mine.unlink()
    written = aic.import_aiconfigurator(tmp_path / "out", "cmd", devices=["h100-sxm"], source=aic_source, force=True)
    assert written == [mine.parent] and mine.read_text().startswith("# Provenance")


# -- outputs that are directories, dangling links or under a missing directory: one line before the work


@pytest.mark.parametrize("argv, flag", [
    (["sweep", "--config", "qwen3-30b.yaml", "--grid", "workload.decode_batch_per_gpu=16,32", "--out", "{d}.csv"],
     "--out"),
    (["sweep", "--config", "qwen3-30b.yaml", "--grid", "workload.decode_batch_per_gpu=16,32", "--out", "{d}.json"],
     "--out"),
    (["pareto", "--config", "qwen3-30b.yaml", "--gpus", "1..2", "--out", "{d}.csv"], "--out"),
    (["pareto", "--config", "qwen3-30b.yaml", "--gpus", "1..2", "--plot", "{d}.png"], "--plot"),
    (["--config", "qwen3-30b.yaml", "--plot", "{d}.png"], "--plot"),
    (["roofline", "--config", "qwen3-30b.yaml", "--out", "{d}.png"], "--out"),
])
def test_an_output_that_is_a_directory_is_refused_before_the_work(capsys, tmp_path, monkeypatch, argv, flag):
    import infersim.sweep.cli as sweep_cli

    def no_work(*_args, **_kwargs):
        raise AssertionError("the work ran before the output was checked")

    monkeypatch.setattr(sweep_cli, "_run", no_work)
    target = next(a for a in argv if a.startswith("{d}")).format(d=tmp_path / "dir")
    Path(target).mkdir()
    code, out, err = run(capsys, *[a.format(d=tmp_path / "dir") for a in argv])
    assert code == 2 and not out
    one_line_error(err, f"{flag} {target}", "is a directory")


def test_sweep_out_a_dangling_link_is_refused_before_the_work(capsys, tmp_path):
    link = tmp_path / "rows.csv"
    link.symlink_to(tmp_path / "missing" / "rows.csv")
    code, out, err = run(capsys, "sweep", "--config", "qwen3-30b.yaml", "--grid",
                         "workload.decode_batch_per_gpu=16,32", "--out", str(link))
    assert code == 2 and not out
    one_line_error(err, f"--out {link}", "symbolic link", "does not exist")


# -- cards import-hf: one card per name, refused before anything is written


@pytest.fixture
def two_configs(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / side / "m" / "config.json" for side in ("x", "y")]
    for path in paths:
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(HF_CONFIG))
    return paths


def test_import_hf_refuses_name_with_several_configs(capsys, tmp_path, two_configs):
    code, _, err = run(capsys, "cards", "import-hf", *map(str, two_configs), "--name", "foo",
                       "--out", str(tmp_path / "cards"))
    assert code == 2
    one_line_error(err, "--name foo", "2 configs")
    assert not (tmp_path / "cards").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_import_hf_refuses_two_configs_making_one_card(capsys, tmp_path, two_configs, force):
    code, _, err = run(capsys, "cards", "import-hf", *map(str, two_configs), "--out", str(tmp_path / "cards"), *force)
    assert code == 2
    one_line_error(err, str(two_configs[0]), str(two_configs[1]), "both make the card 'm'")
    assert not (tmp_path / "cards").exists()


def test_import_hf_writes_nothing_when_one_card_exists(capsys, tmp_path, two_configs):
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "b.yaml").write_text("mine\n")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(HF_CONFIG))
    second.write_text(json.dumps(HF_CONFIG))
    code, _, err = run(capsys, "cards", "import-hf", str(first), str(second), "--out", str(cards))
    assert code == 2
    one_line_error(err, str(cards / "b.yaml"), "exists", "--force")
    assert sorted(os.listdir(cards)) == ["b.yaml"] and (cards / "b.yaml").read_text() == "mine\n"
    code, out, err = run(capsys, "cards", "import-hf", str(first), str(second), "--out", str(cards), "--force")
    assert code == 0, err
    assert sorted(os.listdir(cards)) == ["a.yaml", "b.yaml"] and out.count("wrote ") == 2


def test_import_hf_never_writes_a_card_over_its_config(capsys, tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(json.dumps(HF_CONFIG))
    before = snapshot(config)
    code, _, err = run(capsys, "cards", "import-hf", str(config), "--name", "m", "--out", str(tmp_path), "--force")
    assert code == 2
    one_line_error(err, str(config), "CONFIG.json", "same file")
    assert unchanged(before)


# -- default-named outputs say when they replace a file


def test_plot_default_output_says_it_replaces_a_file(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, err = run(capsys, "--config", "qwen3-30b.yaml", "--format", "json")
    assert code == 0, err
    result = tmp_path / "run.json"
    result.write_text(out)
    picture = tmp_path / "run-breakdown.png"
    code, out, _ = run(capsys, "plot", str(result))
    assert code == 0 and out.strip() == f"wrote {picture} (breakdown)"
    code, out, _ = run(capsys, "plot", str(result))
    assert code == 0 and out.strip() == f"wrote {picture} (breakdown; replacing the file there)"
    code, out, _ = run(capsys, "plot", str(result), "--out", str(picture))  # named by the user: replaced quietly
    assert code == 0 and out.strip() == f"wrote {picture} (breakdown)"


def test_roofline_default_output_says_it_replaces_a_file(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "roofline.png").write_text("an older picture\n")
    code, out, err = run(capsys, "roofline", "--config", "qwen3-30b.yaml")
    assert code == 0, err
    assert out.strip() == "wrote roofline.png (roofline; replacing the file there)"
    assert (tmp_path / "roofline.png").read_bytes().startswith(b"\x89PNG")
