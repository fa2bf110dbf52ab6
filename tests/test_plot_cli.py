"""`infersim plot`, `infersim roofline` and `--plot` end to end, and the missing-matplotlib path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TEST_CACHE_DIR

from infersim.cli.main import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["--config", "qwen3-30b.yaml", "--format", "json"]) == 0
    path = tmp_path / "run.json"
    path.write_text(capsys.readouterr().out)
    return path


def _no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import matplotlib` fail as it does where the plot extra is not installed."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.parametrize("argv", [
    ["plot", "{run}", "--out", "{tmp}/x.png"],
    ["plot", "{run}"],
    ["roofline", "--config", "qwen3-30b.yaml", "--out", "{tmp}/x.png"],
])
def test_without_matplotlib_one_line_naming_the_install_and_exit_2(
        argv: list[str], run_json: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _no_matplotlib(monkeypatch)
    args = [a.format(run=run_json, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # the check comes before the simulation: nothing printed, nothing written
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("infersim: error:") and "pip install matplotlib (or, in the infersim clone: pip " \
        "install '.[plot]')" in lines[0]
    assert "Traceback" not in captured.err
    assert not (tmp_path / "x.png").exists()


def test_run_plot_without_matplotlib_prints_the_report_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--plot` on the main command: the report is not lost to a missing matplotlib; the error
    follows it as one line, exit 2, and no picture is written."""
    _no_matplotlib(monkeypatch)
    assert main(["--config", "qwen3-30b.yaml", "--plot", str(tmp_path / "x.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("InferSim: qwen3-30b-a3b on h20") and "DECODE   TPOT" in captured.out
    assert captured.err.strip().splitlines() == [
        f"infersim: error: --plot {tmp_path / 'x.png'} needs matplotlib, which is not installed: pip install "
        "matplotlib (or, in the infersim clone: pip install '.[plot]')"]
    assert not (tmp_path / "x.png").exists()


def test_run_plot_bad_format_fails_before_simulating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "qwen3-30b.yaml", "--plot", str(tmp_path / "x.gif")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "unknown picture format '.gif'" in captured.err


def test_plain_run_never_imports_matplotlib() -> None:
    code = ("import sys, io, contextlib\nfrom infersim.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(['--config', 'qwen3-30b.yaml'])\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported by a plain run'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "INFERSIM_CACHE_DIR": TEST_CACHE_DIR})
    assert done.returncode == 0, done.stderr


@pytest.fixture
def needs_matplotlib() -> None:
    pytest.importorskip("matplotlib")


@pytest.mark.usefixtures("needs_matplotlib")
def test_run_with_plot_writes_the_breakdown_and_keeps_stdout_clean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "breakdown.png"
    assert main(["--config", "qwen3-30b.yaml", "--format", "json", "--plot", str(out)]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # stdout is still only the JSON
    from infersim.run.config import load_run_config
    from infersim.run.simulate import simulate

    assert data["prefill"]["ttft_ms"] == pytest.approx(
        simulate(load_run_config("qwen3-30b.yaml")).prefill.step_time_s * 1e3, rel=1e-12)
    assert captured.err.strip() == f"wrote {out}"
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.usefixtures("needs_matplotlib")
@pytest.mark.parametrize("suffix,magic", [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_format_follows_the_extension(suffix: str, magic: bytes, run_json: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"roofline{suffix}"
    assert main(["plot", str(run_json), "--kind", "roofline", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (roofline)"
    assert out.read_bytes().startswith(magic)


@pytest.mark.usefixtures("needs_matplotlib")
def test_plot_default_name_beside_the_result(run_json: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(run_json)]) == 0
    expected = run_json.with_name("run-breakdown.png")
    assert capsys.readouterr().out.strip() == f"wrote {expected} (breakdown)"
    assert expected.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.usefixtures("needs_matplotlib")
def test_roofline_command_takes_the_run_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "roofline.png"
    assert main(["roofline", "--config", "qwen3-30b.yaml", "--set", "hardware=h800", "--stage", "decode",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (roofline)"
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.usefixtures("needs_matplotlib")
@pytest.mark.parametrize("argv,message", [
    (["plot", "{tmp}/missing.json"], "missing.json: no such file"),
    (["plot", "{run}", "--out", "{tmp}/x.gif"], "unknown picture format '.gif'"),
    (["plot", "{run}", "--out", "{tmp}/nowhere/x.png"], "does not exist"),
    (["plot", "{run}", "--kind", "serve", "--out", "{tmp}/x.png"], "run output, which draws as breakdown or roofline"),
    (["plot", "{tmp}/bad.json", "--out", "{tmp}/x.png"], "not JSON"),
    (["plot", "{tmp}/odd.json", "--out", "{tmp}/x.png"], "cannot tell which command wrote it"),
    (["--config", "qwen3-30b.yaml", "--plot", "{tmp}/x.txt"], "--plot {tmp}/x.txt: unknown picture format"),
])
def test_bad_input_is_one_clear_line(argv: list[str], message: str, run_json: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "odd.json").write_text('{"hello": 1}')
    args = [a.format(run=run_json, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message.format(tmp=tmp_path) in err


@pytest.mark.usefixtures("needs_matplotlib")
def test_plot_reads_stdin(run_json: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(run_json.read_text()))
    out = tmp_path / "from-stdin.png"
    assert main(["plot", "-", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
