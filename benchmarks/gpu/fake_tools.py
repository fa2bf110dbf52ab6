"""Stand-ins for the three GPU tools, for testing run_all.py's orchestration where there is no torch (CI).

    python3 benchmarks/gpu/fake_tools.py bench|e2e|traces [--case-seconds S] [--hang TOOLS] [--ignore-term]
                                         -- TOOL ARGS

Each takes its tool's own arguments and writes the tool's files in the tool's layout, marked as measuring
nothing: `bench` runs the real `mfu bench` loop (infersim.tabletools.bench.run_bench, budgets and summary
included) over a backend whose kernels do nothing, timed as S seconds each; `e2e` writes a validation file of
the one-run plan's points (provenance smoke: true, fake: true, so `validate` compares none) and its summary;
`traces` writes two tiny placeholder traces with their run configs, recorded.json and a summary. `--hang
TOOLS` (comma-separated) makes those tools stop after their first part and wait forever (as a stuck kernel
would); `--ignore-term` makes them ignore SIGTERM too, so only SIGKILL ends them. Nothing here is a measurement.
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

FAKE_DEVICE = "fake GPU (orchestration test: nothing is measured)"
FAKE_NOTE = "fake_tools.py stand-in: no kernel ran, every number is invented"


def fake_bench(argv: list[str], case_seconds: float, hang: Callable[[], None]) -> int:
    from infersim.tabletools.bench import Environment, HostResult, Prepared
    from infersim.tabletools.cli import bench_command, register
    from infersim.tables.format import DeviceInfo

    class Backend:
        def environment(self) -> Environment:
            return Environment(DeviceInfo(FAKE_DEVICE), {"torch": "0+fake", "device_note": FAKE_NOTE})

        def prepare(self, case: Any) -> Prepared:
            return Prepared(lambda: None, f"fake {case.family} kernel")

        def release(self) -> None:
            pass

        def host_probe(self, case: Any) -> HostResult:
            return HostResult({case.probe: 1e-6}, [FAKE_NOTE])

    class Timer:
        description = f"fake timer: {case_seconds:g} s of sleep per case, latency 10 us"
        families: set[str] = set()

        def measure(self, case: Any, launch: Callable[[], Any]) -> float:
            launch()
            time.sleep(case_seconds)
            if len(self.families) == 1 and case.family not in self.families:
                hang()  # after the first family
            self.families.add(case.family)
            return 1e-5

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    args.command_line = "fake_tools.py bench -- " + " ".join(argv)
    args.hardware = args.hardware or "h100-sxm"  # peak FLOP/s for the efficiency column; nothing is measured
    return bench_command(args, backend=Backend(), timer=Timer())


def fake_e2e(argv: list[str], case_seconds: float, hang: Callable[[], None]) -> int:
    import measure_e2e
    from gpu_plan import point_label

    from infersim.tabletools.bench.budget import PartRecord, StageSummary, part_deadlines, part_status

    args = measure_e2e.parse_args(argv)
    args.smoke = True
    plans = measure_e2e.chosen_plans(args)
    assert not isinstance(plans, str), plans
    card = "fake"
    prov = {"script": "benchmarks/gpu/fake_tools.py", "smoke": True, "fake": True, "device": FAKE_DEVICE,
            "hardware_card": "h100-sxm", "note": FAKE_NOTE, "torch": "0+fake", "transformers": "0+fake"}
    writer = measure_e2e.PointWriter(args.out / f"e2e-{card}-{args.mode}.yaml", {"format": measure_e2e.FORMAT,
                                                                                 "provenance": prov})
    budgets = [(plan.name, case_seconds * len(plan.points(args.mode)) * 2) for plan in plans]
    deadlines = part_deadlines(budgets, args.budget)
    parts = [PartRecord(plan.name, len(plan.points(args.mode)), seconds, budget_s=seconds,
                        deadline_s=deadlines[plan.name], estimate_source="fake") for plan, (_n, seconds)
             in zip(plans, budgets)]
    summary = StageSummary(args.summary, "fake measure_e2e.py", args.budget, parts, mode=args.mode)
    for index, plan in enumerate(plans):
        part = summary.begin(plan.name)
        for metric, batch, prompt in plan.points(args.mode):
            label = point_label(plan.name, metric, batch, prompt)
            if summary.elapsed() + case_seconds > (part.deadline_s or 0.0):
                summary.not_done(plan.name, label, "skipped: no time left of its budget")
                continue
            time.sleep(case_seconds)
            config = measure_e2e.load_config(plan.name, plan.layers_for(args.mode), True)
            writer.add({"id": f"fake-{plan.name}-{args.mode}-{metric}-b{batch}-p{prompt}",
                        "model": {"name": f"{plan.name}-{config['num_hidden_layers']}l", "config": config},
                        "mode": args.mode, "engine": measure_e2e.ENGINES[args.mode], "hardware": "h100-sxm",
                        "batch": batch, "prompt_tokens": prompt, "new_tokens": [2, 12], "metric": metric,
                        "value": 1.0, "unit": "ms", "samples_ms": [1.0], "provenance": prov})
            summary.done_one(plan.name)
        summary.end(plan.name, part_status(part))
        if index == 0:
            hang()
    writer.handle.write("not_measured: []\n")
    writer.close()
    return 0


def fake_traces(argv: list[str], case_seconds: float, hang: Callable[[], None]) -> int:
    from record_traces import config_fields

    from infersim.tabletools.bench.budget import PartRecord, StageSummary

    parser = argparse.ArgumentParser()
    for option in ("--out", "--models", "--modes", "--shape-sets", "--layers", "--decode-steps", "--budget",
                   "--summary", "--device"):
        parser.add_argument(option)
    parser.add_argument("--check", action=argparse.BooleanOptionalAction)
    for flag in ("--quick", "--tiny", "--eager-prefill"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args(argv)
    out, layers, model = Path(args.out), int(args.layers), args.models.split(",")[0]
    modes = args.modes.split(",")
    parts = [PartRecord(f"{model} {mode} main", 1, case_seconds, estimate_source="fake") for mode in modes]
    summary = StageSummary(Path(args.summary), "fake record_traces.py", float(args.budget), parts)
    recorded: dict[str, Any] = {"torch": "0+fake", "device": FAKE_DEVICE, "traces": [], "failed": [],
                                "skipped (time budget)": [], "stopped": ""}
    (out / f"{model}-{layers}l.config.json").write_text(json.dumps(config_fields(model, layers, tiny=True)))
    run_config = f"{model}-{layers}l-p1x128-d2.run.yaml"
    (out / run_config).write_text(f"# fake_tools.py: {FAKE_NOTE}\nmodel: {model}-{layers}l.config.json\n"
                                  f"hardware: h100-sxm\nengine: huggingface\n")
    for index, (mode, part) in enumerate(zip(modes, parts)):
        summary.begin(part.name)
        time.sleep(case_seconds)
        name = f"{model}-{layers}l-{mode}-fake-p1x128-d2.json.gz"
        with gzip.open(out / name, "wt", encoding="utf-8") as handle:
            json.dump({"traceEvents": [], "fake": FAKE_NOTE}, handle)
        recorded["traces"].append(name)
        (out / "recorded.json").write_text(json.dumps(recorded, indent=1))
        summary.done_one(part.name)
        summary.end(part.name, "complete")
        if index == 0:
            hang()
    return 0


TOOLS = {"bench": fake_bench, "e2e": fake_e2e, "traces": fake_traces}


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    ours, tool_args = (given[:given.index("--")], given[given.index("--") + 1:]) if "--" in given else (given, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", choices=sorted(TOOLS))
    parser.add_argument("--case-seconds", type=float, default=0.001, help="seconds each case or point takes")
    parser.add_argument("--hang", default="", help="these tools (comma-separated) wait forever after their first part")
    parser.add_argument("--ignore-term", action="store_true", help="a hanging tool ignores SIGTERM (only SIGKILL "
                                                                   "ends it)")
    args = parser.parse_args(ours)
    hangs = args.tool in args.hang.split(",")

    def hang() -> None:
        if hangs and args.ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while hangs:
            time.sleep(0.05)

    return TOOLS[args.tool](tool_args, args.case_seconds, hang)


if __name__ == "__main__":
    raise SystemExit(main())
