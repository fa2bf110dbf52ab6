"""The one-command GPU run: kernel tables, end-to-end points and two traces within one time budget.

    OUT=... bash benchmarks/gpu/run_gpu.sh all               # on a GPU: at most 8 minutes, 5 files in $OUT
    python3 benchmarks/gpu/run_all.py --out /tmp/run --smoke  # the same pipeline on the CPU, tiny sizes, seconds
    python3 benchmarks/gpu/run_all.py --out /tmp/run --fake   # stand-in tools (fake_tools.py): no torch needed

Four stages in order of value, each a process of the existing tools:
  tables        python3 -m infersim mfu bench --family-budgets ...: GEMM bf16, GEMM fp8, attention prefill,
                attention decode, grouped GEMM, elementwise, host costs, one family after the other
  e2e-eager     measure_e2e.py --mode eager --plan one-run: TTFT and decode points of the validation set
  e2e-compiled  measure_e2e.py --mode compiled --plan one-run
  traces        record_traces.py: one small model traced eager and compiled
Budgets come from estimates (gpu_plan.py says where each comes from): each stage's is the process start, the
grace it ends within (and mfu bench's final write) plus gpu_plan.SAFETY times its estimated work, fitted in
order into --budget (what does not fit is skipped, the last stages first); `--plan` prints them. Each stage ends at its deadline (infersim.tabletools.bench.budget.part_deadlines: time an
earlier stage leaves passes on): the tool gets a budget a little inside it and stops by itself; a tool still
running near the deadline gets SIGTERM (each tool then writes what it has), then SIGKILL at the deadline.
Inside a stage the tool splits its budget the same way over its parts (families, models, variants).

$OUT receives, rewritten after every stage so that a run cut anywhere keeps what finished:
  manifest.json            what ran, what was cut or skipped and why, estimates beside timings, per stage and part
  run.log                  this script's log, with the end of each stage's output
  tables-<card>.tar.gz     <card>/ (the table directory: CSVs and provenance.yaml), bench.log, summary.json
  e2e-<card>.tar.gz        e2e-<card>-eager.yaml, e2e-<card>-compiled.yaml, their logs and summaries
  traces-<card>.tar.gz     the traces (*.json.gz) with their run configs and HF configs, recorded.json, the log
benchmarks/gpu/install_results.py installs them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import gpu_plan  # noqa: E402
from record_traces import GPU_SHAPES, CPU_SHAPES, config_fields  # noqa: E402

from infersim.cards.registry import bundled_dir  # noqa: E402
from infersim.tabletools.bench.budget import fit_budgets, part_deadlines, read_summary  # noqa: E402
from infersim.tabletools.bench.cases import BUDGET_GROUPS, budget_group, estimated_seconds  # noqa: E402
from infersim.tabletools.bench.environment import nvidia_smi  # noqa: E402
from infersim.tabletools.bench.plan import BENCH_MODELS, BenchOptions, load_cards, plan_cases  # noqa: E402
from infersim.tabletools.bench.runner import hardware_card_for  # noqa: E402

MANIFEST_FORMAT = "infersim-gpu-run-1"
STAGES = ("tables", "e2e-eager", "e2e-compiled", "traces")
#: the command's limit is 8 minutes: 470 s of stages leaves the last archive and manifest their seconds
DEFAULT_BUDGET = 470.0
SMOKE_BUDGET = 150.0
#: a smoke run's stages: a fixed few seconds each (the estimates are a GPU's; a loaded two-core CPU is slower)
SMOKE_STAGE_BUDGETS = {"tables": 40.0, "e2e-eager": 45.0, "e2e-compiled": 30.0, "traces": 35.0}
#: a smoke run's kernel tables: one dense and one MoE model (every family, fewer shapes)
SMOKE_BENCH_MODELS = ("llama-2-7b", "mixtral-8x7b")
#: a tool gets its window less this, so that it stops by itself and writes before the signals come (a
#: smoke or fake run: SMALL_GRACE); a stage starts only with at least LEAST_WINDOW seconds before its deadline
GRACE, SMALL_GRACE = 8.0, 5.0
LEAST_WINDOW, SMALL_LEAST_WINDOW = gpu_plan.PROCESS_START + 5.0, 3.0
#: a tool's start-up on the CPU: python3 importing torch (smoke) or nothing heavy (fake), an assumption
SMOKE_PROCESS_START, FAKE_PROCESS_START = 6.0, 2.0
#: what mfu bench keeps of its --time-budget for its final write (infersim.tabletools.bench.run_bench's reserve_seconds)
BENCH_RESERVE = 5.0
#: SIGTERM this long before a stage's deadline, SIGKILL at it
TERM_BEFORE = 3.0
#: the trace variants of the one-command run: one small dense model, eager and compiled (its prefill eager, as
#: generate() and the huggingface-compiled card run it), the main shapes
TRACE_MODEL, TRACE_LAYERS, TRACE_STEPS = "llama-2-7b", 2, 4


@dataclass
class StagePlan:
    name: str
    estimate_s: float
    estimate_source: str
    budget_s: float = 0.0
    deadline_s: float = 0.0
    parts: list[tuple[str, float]] = field(default_factory=list)  # (part, estimated seconds of work)


@dataclass
class StageRecord:
    """What a stage did, for the manifest."""

    name: str
    status: str
    why: str = ""
    estimate_s: float = 0.0
    estimate_source: str = ""
    budget_s: float = 0.0
    deadline_s: float = 0.0
    started_s: float | None = None
    seconds: float = 0.0
    exit_code: int | None = None
    signals: list[str] = field(default_factory=list)
    command: str = ""
    archive: str = ""
    parts: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The plan: estimates and budgets


def table_parts(smoke: bool) -> list[tuple[str, float]]:
    """(family, estimated seconds) of `mfu bench`'s default plan, in order of value (cases.BUDGET_GROUPS)."""
    options = BenchOptions().smoke() if smoke else BenchOptions()
    cases = plan_cases(load_cards(bundled_dir("models"), SMOKE_BENCH_MODELS if smoke else BENCH_MODELS), options)
    totals = {group: 0.0 for group in BUDGET_GROUPS}
    for case in cases:
        totals[budget_group(case)] += estimated_seconds(case)
    return [(group, seconds) for group, seconds in totals.items() if seconds > 0]


def e2e_parts(mode: str, smoke: bool) -> list[tuple[str, float]]:
    """(model, estimated seconds: building it and its points) of measure_e2e.py's one-run plan in `mode`."""
    plans = [gpu_plan.smoke_plan(p) if smoke else p for p in gpu_plan.ONE_RUN_PLAN]
    parts = []
    for plan in plans:
        if plan.points(mode):
            build, points = gpu_plan.model_seconds(
                plan, mode, smoke, *((gpu_plan.SMOKE_NEW_TOKENS, gpu_plan.SMOKE_REPEATS) if smoke else
                                     (gpu_plan.NEW_TOKENS, gpu_plan.REPEATS)))
            parts.append((plan.name, build + sum(seconds for _label, seconds in points)))
    return parts


def trace_parts(smoke: bool) -> list[tuple[str, float]]:
    shapes = (CPU_SHAPES if smoke else GPU_SHAPES)[0]
    fields = config_fields(TRACE_MODEL, TRACE_LAYERS, tiny=smoke)
    return [(f"{TRACE_MODEL} {mode} main", gpu_plan.trace_seconds(mode, TRACE_LAYERS, shapes.prompt,
                                                                  shapes.decode_batch, TRACE_STEPS, fields,
                                                                  compiled_prefill=False))
            for mode in ("eager", "compiled")]


def plan_stages(names: Sequence[str], budget: float, smoke: bool,
                given: dict[str, float] | None = None) -> list[StagePlan]:
    """Each stage's estimate, budget (`given`, else derived from the estimate) and deadline (seconds after the
    start), fitted in order into `budget`."""
    parts = {"tables": lambda: table_parts(smoke), "e2e-eager": lambda: e2e_parts("eager", smoke),
             "e2e-compiled": lambda: e2e_parts("compiled", smoke), "traces": lambda: trace_parts(smoke)}
    sources = {"tables": "infersim.tabletools.bench.cases.estimated_seconds per case of the default plan",
               "e2e-eager": "gpu_plan.point_seconds per point and BUILD_SECONDS per model",
               "e2e-compiled": "gpu_plan.point_seconds per point (a compile each) and BUILD_SECONDS per model",
               "traces": "gpu_plan.trace_seconds per variant"}
    plans = []
    for name in names:
        stage_parts = parts[name]()
        work = sum(seconds for _part, seconds in stage_parts)
        plan = StagePlan(name, round(gpu_plan.PROCESS_START + work, 1),
                         f"{sources[name]}, plus gpu_plan.PROCESS_START", parts=stage_parts)
        # the tool's start-up, the grace it ends within, and (mfu bench) its final write, around its parts' budgets
        overhead = gpu_plan.PROCESS_START + GRACE + (BENCH_RESERVE if name == "tables" else 0.0)
        plan.budget_s = SMOKE_STAGE_BUDGETS[name] if smoke else overhead + gpu_plan.SAFETY * work
        if given and name in given:
            plan.budget_s = given[name]
        plans.append(plan)
    wanted = [(p.name, p.budget_s) for p in plans]
    deadlines = part_deadlines(wanted, budget)
    for plan, (_name, seconds) in zip(plans, fit_budgets(wanted, budget)):
        plan.budget_s, plan.deadline_s = round(seconds, 1), round(deadlines[plan.name], 1)
    return plans


def part_budgets(plan: StagePlan, small: bool = False) -> list[tuple[str, float]]:
    """The budget each part of a stage gets when the stage starts on time and its tool starts in the time
    allowed (what the tool itself derives from its budget: mfu bench shares it by the estimates, the other
    tools fit gpu_plan.SAFETY times each estimate in order)."""
    start = (SMOKE_PROCESS_START if small else gpu_plan.PROCESS_START)
    window = plan.budget_s - (SMALL_GRACE if small else GRACE) - start
    if plan.name == "tables":
        work = sum(seconds for _part, seconds in plan.parts) or 1.0
        return [(part, seconds * max(window - BENCH_RESERVE, 0.0) / work) for part, seconds in plan.parts]
    return fit_budgets([(part, gpu_plan.SAFETY * seconds) for part, seconds in plan.parts], window)


def plan_lines(plans: list[StagePlan], budget: float, small: bool) -> list[str]:
    lines = [f"{budget:.0f} s for {len(plans)} stages, in order of value (estimates: benchmarks/gpu/gpu_plan.py)",
             f"{'stage / part':<34}{'estimate':>9}{'budget':>8}{'deadline':>10}"]
    for plan in plans:
        lines.append(f"{plan.name:<34}{plan.estimate_s:>7.0f} s{plan.budget_s:>6.0f} s{plan.deadline_s:>8.0f} s")
        estimates = dict(plan.parts)
        for part, seconds in part_budgets(plan, small):
            lines.append(f"  {part:<32}{estimates[part]:>7.1f} s{seconds:>6.1f} s")
    return lines


def family_budgets(plan: StagePlan, seconds: float) -> str:
    """mfu bench's --family-budgets: `seconds` shared in proportion to the families' estimates."""
    work = sum(estimate for _family, estimate in plan.parts) or 1.0
    return ",".join(f"{family}={estimate * max(seconds, 0.0) / work:.1f}" for family, estimate in plan.parts)


# ---------------------------------------------------------------------------------------------
# Commands


@dataclass
class Run:
    """One run of this script: its options, folders, card and clock."""

    out: Path
    work: Path
    card: str
    device: str
    smoke: bool
    fake: bool
    fake_options: list[str]
    python: str = sys.executable
    start: float = field(default_factory=time.monotonic)
    process_start: float = gpu_plan.PROCESS_START  # what a tool's start-up is allowed
    log_lines: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def log(self, text: str) -> None:
        line = f"[{self.elapsed():6.1f} s] {text}"
        print(line, flush=True)
        self.log_lines.append(line)

    def tool(self, script: str, tool: str) -> list[str]:
        """The command that runs a tool: the real one, or its stand-in in a fake run."""
        if self.fake:
            return [self.python, str(HERE / "fake_tools.py"), tool, *self.fake_options, "--"]
        if script == "-m infersim":
            return [self.python, "-m", "infersim"]
        return [self.python, str(HERE / script)]


def stage_command(run: Run, plan: StagePlan, soft: float) -> tuple[list[str], Path]:
    """(command, the folder it writes) of one stage, its tool told to end within `soft` seconds."""
    small = run.smoke or run.fake  # the stand-ins take the smoke run's arguments
    device = ["--device", "cpu"] if small else []
    if plan.name == "tables":
        models = ["--model", ",".join(SMOKE_BENCH_MODELS)] if small else []
        # mfu bench counts its --time-budget from the end of its start-up (torch, the CUDA context, the device),
        # and keeps BENCH_RESERVE of it for its final write: the families share the rest
        measuring = max(soft - run.process_start, 1.0)
        folder = run.work / "tables"
        return [*run.tool("-m infersim", "bench"), "mfu", "bench", "--out", str(folder / run.card),
                "--family-budgets", family_budgets(plan, measuring - BENCH_RESERVE),
                "--time-budget", f"{measuring:.1f}",
                "--summary", str(folder / "summary.json"), *device, *models], folder
    if plan.name.startswith("e2e-"):
        mode = plan.name.removeprefix("e2e-")
        folder = run.work / "e2e"
        return [*run.tool("measure_e2e.py", "e2e"), "--mode", mode, "--plan", "one-run", "--out", str(folder),
                "--budget", f"{max(soft, 1.0):.1f}", "--summary", str(folder / f"summary-{mode}.json"),
                *device, *(["--smoke"] if small else [])], folder
    folder = run.work / "traces"
    return [*run.tool("record_traces.py", "traces"), "--out", str(folder), "--models", TRACE_MODEL,
            "--modes", "eager,compiled", "--eager-prefill", "--shape-sets", "main", "--layers", str(TRACE_LAYERS),
            "--decode-steps", str(TRACE_STEPS), "--budget", f"{max(soft, 1.0):.1f}",
            "--summary", str(folder / "summary.json"), "--no-check",
            *(["--device", "cpu", "--quick", "--tiny"] if small else ["--device", "cuda"])], folder


# ---------------------------------------------------------------------------------------------
# Running a stage


def run_process(command: list[str], log_path: Path, deadline: float, run: Run) -> tuple[int | None, list[str]]:
    """Run `command` in its own process group, output to `log_path`; SIGTERM TERM_BEFORE seconds before
    `deadline` (seconds after the run's start), SIGKILL at it. (exit code or None, signals sent)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    sent: list[str] = []
    with log_path.open("w", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        for sig, at in ((signal.SIGTERM, deadline - TERM_BEFORE), (signal.SIGKILL, deadline)):
            try:
                return process.wait(timeout=max(at - run.elapsed(), 0.01)), sent
            except subprocess.TimeoutExpired:
                _signal_group(process, sig)
                sent.append(f"{signal.Signals(sig).name} at {run.elapsed():.1f} s")
        process.wait()
    return None, sent


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the tool and what it started (Inductor's compile workers)
    except (ProcessLookupError, PermissionError):
        pass


def stage_status(record: StageRecord) -> tuple[str, str]:
    """(status, why) of a finished stage from its exit, the signals it got and its parts."""
    states = [str(part.get("status", "")) for part in record.parts]
    done = sum(int(part.get("done", 0)) for part in record.parts)
    if record.signals:
        return "killed", ("stopped at its deadline (" + "; ".join(record.signals) + "): what it wrote before is "
                          "kept, and its parts say how far each got")
    if record.exit_code not in (0, None) and not done:
        return "failed", f"exit status {record.exit_code} with nothing measured: see its log in {record.archive}"
    if not states:
        return ("complete", "") if record.exit_code == 0 else ("failed", "no summary written: see its log")
    others = {state: states.count(state) for state in dict.fromkeys(states) if state != "complete"}
    if not others:
        return "complete", ""
    why = ", ".join(f"{count} {state}" for state, count in others.items()) + \
        f" of {len(states)} parts: the parts say which and why"
    left_out = {"stopped", "cut", "skipped", "not started", "running"}
    return ("cut" if left_out & set(others) else "partial"), why


def run_stage(run: Run, plan: StagePlan) -> StageRecord:
    record = StageRecord(plan.name, "skipped", estimate_s=plan.estimate_s, estimate_source=plan.estimate_source,
                         budget_s=plan.budget_s, deadline_s=plan.deadline_s, archive=archive_name(plan.name, run.card))
    window = plan.deadline_s - run.elapsed()
    small = run.smoke or run.fake
    least = SMALL_LEAST_WINDOW if small else LEAST_WINDOW
    if window < least:
        record.why = (f"not started: {max(window, 0):.1f} s left before its deadline ({plan.deadline_s:.0f} s after "
                      f"the start), and a stage needs at least {least:.0f} s (its own budget, after the earlier "
                      f"stages': {plan.budget_s:.0f} s)")
        run.log(f"{plan.name}: skipped ({record.why})")
        return record
    command, folder = stage_command(run, plan, window - (SMALL_GRACE if small else GRACE))
    folder.mkdir(parents=True, exist_ok=True)
    record.command, record.started_s = shlex.join(command), round(run.elapsed(), 1)
    run.log(f"{plan.name}: started, {window:.0f} s to its deadline (estimate {plan.estimate_s:.0f} s)")
    log_path = folder / (f"{plan.name}.log" if plan.name != "tables" else "bench.log")
    record.exit_code, record.signals = run_process(command, log_path, plan.deadline_s, run)
    record.seconds = round(run.elapsed() - record.started_s, 1)
    record.parts = stage_parts(plan.name, folder)
    record.status, record.why = stage_status(record)
    for part in record.parts:
        if record.signals and part.get("status") == "running":
            part["status"] = "killed"  # the part the tool was in when its deadline came
    run.log(f"{plan.name}: {record.status} in {record.seconds:.0f} s" + (f" ({record.why})" if record.why else ""))
    for line in _tail(log_path, 6):
        run.log(f"    | {line}")
    return record


def stage_parts(name: str, folder: Path) -> list[dict[str, Any]]:
    summary_file = folder / (f"summary-{name.removeprefix('e2e-')}.json" if name.startswith("e2e-") else "summary.json")
    summary = read_summary(summary_file)
    return list(summary.get("parts", [])) if summary else []


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line[:200] for line in text if line.strip()][-lines:]


# ---------------------------------------------------------------------------------------------
# Output: archives, manifest, log


def archive_name(stage: str, card: str) -> str:
    return f"{stage.split('-')[0]}-{card}.tar.gz"


def write_archive(run: Run, stage: str) -> None:
    """The stage's folder as $OUT/<archive> (written beside, then renamed: never half a file)."""
    folder = run.work / stage.split("-")[0]
    if not folder.is_dir():
        return
    target = run.out / archive_name(stage, run.card)
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.endswith(".partial"):
                tar.add(path, arcname=str(path.relative_to(folder)))
    os.replace(partial, target)


def manifest(run: Run, records: list[StageRecord], budget: float, argv: Sequence[str]) -> dict[str, Any]:
    archives = sorted({r.archive for r in records if (run.out / r.archive).is_file()})
    return {
        "format": MANIFEST_FORMAT, "command": shlex.join(["benchmarks/gpu/run_all.py", *argv]),
        "card": run.card, "device": run.device, "smoke": run.smoke, "fake": run.fake,
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget, "elapsed_s": round(run.elapsed(), 1),
        "estimates": {"source": "benchmarks/gpu/gpu_plan.py (its docstring names each constant's source)",
                      "safety": gpu_plan.SAFETY, "process_start_s": gpu_plan.PROCESS_START},
        "stages": [asdict(r) for r in records],
        "files": {"manifest.json": "this file", "run.log": "benchmarks/gpu/run_all.py's log",
                  **{name: "archive: benchmarks/gpu/install_results.py installs it" for name in archives}},
    }


def write_outputs(run: Run, records: list[StageRecord], budget: float, argv: Sequence[str]) -> None:
    data = manifest(run, records, budget, argv)
    partial = run.out / "manifest.json.partial"
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, run.out / "manifest.json")
    (run.out / "run.log").write_text("\n".join(run.log_lines) + "\n", encoding="utf-8")


def summary_lines(records: list[StageRecord]) -> list[str]:
    """A short table: each stage, then each of its parts."""
    lines = [f"{'stage / part':<34}{'status':<10}{'estimate':>9}{'budget':>8}{'took':>8}  done"]
    for r in records:
        lines.append(f"{r.name:<34}{r.status:<10}{r.estimate_s:>8.0f}s{r.budget_s:>7.0f}s{r.seconds:>7.0f}s"
                     + (f"  {r.why}" if r.why else ""))
        for part in r.parts:
            budget = part.get("budget_s") or 0.0
            lines.append(f"  {part['name']:<32}{part['status']:<10}{part['estimate_s']:>8.1f}s{budget:>7.1f}s"
                         f"{part['seconds']:>7.1f}s  {part['done']}/{part['planned']}")
    return lines


# ---------------------------------------------------------------------------------------------
# Main


def detect_card(smoke: bool, fake: bool) -> tuple[str, str]:
    """(card name for the files, device name) of the GPU this runs on."""
    if fake:
        return "fake", "fake GPU (orchestration test: nothing is measured)"
    if smoke:
        return "cpu-smoke", "CPU (smoke run, no GPU)"
    names = nvidia_smi("name")
    device = names[0] if names else "unknown GPU (nvidia-smi gave no name)"
    return hardware_card_for(device) or "unknown-gpu", device


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=("all",), help="all (the only set today)")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                        help="where the files go (default: $OUT)")
    parser.add_argument("--smoke", action="store_true", help="the same pipeline on the CPU at tiny sizes (needs torch "
                                                             "and transformers; measures nothing)")
    parser.add_argument("--fake", action="store_true", help="stand-in tools that need no torch (tests)")
    parser.add_argument("--fake-options", default="", help="options for the stand-ins (fake_tools.py --help)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for all stages (default {DEFAULT_BUDGET:g}; smoke {SMOKE_BUDGET:g})")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"a subset of {','.join(STAGES)}, in this order")
    parser.add_argument("--stage-budgets", default="", metavar="STAGE=SECONDS,...",
                        help="budgets that replace the ones derived from the estimates")
    parser.add_argument("--plan", action="store_true", help="print the stages and parts with their estimates, "
                                                            "budgets and deadlines, and run nothing")
    parser.add_argument("--work", type=Path, default=None, help="folder for the stages' files (default: a new "
                                                                 "temporary folder)")
    args = parser.parse_args(argv)
    if args.out is None and not args.plan:
        parser.error("give --out or set OUT")
    unknown = [s for s in args.stages.split(",") if s and s not in STAGES]
    if unknown:
        parser.error(f"--stages: unknown {unknown[0]!r} (known: {', '.join(STAGES)})")
    try:
        args.stage_budgets = {name.strip(): float(seconds) for name, _eq, seconds in
                              (part.partition("=") for part in args.stage_budgets.split(",") if part)}
    except ValueError:
        parser.error(f"--stage-budgets {args.stage_budgets!r}: expected STAGE=SECONDS,...")
    if set(args.stage_budgets) - set(STAGES):
        parser.error(f"--stage-budgets: unknown stage (known: {', '.join(STAGES)})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(given)
    budget = args.budget if args.budget is not None else (SMOKE_BUDGET if args.smoke or args.fake else DEFAULT_BUDGET)
    names = [s for s in STAGES if s in args.stages.split(",")]
    plans = plan_stages(names, budget, args.smoke or args.fake, args.stage_budgets)
    if args.plan:
        print("\n".join(plan_lines(plans, budget, args.smoke or args.fake)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    card, device = detect_card(args.smoke, args.fake)
    work = args.work or Path(tempfile.mkdtemp(prefix="infersim-gpu-run-"))
    run = Run(args.out, work, card, device, args.smoke, args.fake, shlex.split(args.fake_options))
    if args.smoke or args.fake:
        run.process_start = SMOKE_PROCESS_START if args.smoke else FAKE_PROCESS_START
    run.log(f"run_all: {device} (card {card}); {budget:.0f} s for {', '.join(names)}; work folder {work}")
    for plan in plans:
        run.log(f"  plan {plan.name}: estimate {plan.estimate_s:.0f} s, budget {plan.budget_s:.0f} s, "
                f"deadline {plan.deadline_s:.0f} s")
    records: list[StageRecord] = []
    for plan in plans:
        records.append(run_stage(run, plan))
        write_archive(run, plan.name)
        write_outputs(run, records, budget, given)
    for line in summary_lines(records):
        run.log(line)
    write_outputs(run, records, budget, given)
    if args.work is None and not args.smoke and not args.fake:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if any(r.status in ("complete", "cut", "partial", "killed") for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
