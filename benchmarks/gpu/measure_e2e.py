"""End-to-end GPU validation set: TTFT and per-step decode time of HF transformers on this GPU, written
as a validation file `python -m infersim validate` reads beside the public reference.

    python3 benchmarks/gpu/measure_e2e.py --mode eager --out $OUT --budget 540
    python3 benchmarks/gpu/measure_e2e.py --mode compiled --plan one-run --out $OUT --budget 120
    python3 benchmarks/gpu/measure_e2e.py --device cpu --smoke --out /tmp/e2e      # proves the script, measures nothing

No downloads: each model is built from the HF config.json in benchmarks/gpu/configs/ with random bf16 weights
(quantisation settings dropped), cut to a few layers so it fits one GPU (the simulator is given the same cut
config, so what is checked is the per-layer cost and the per-step overhead around it). The held-out models
(Llama-3.1-8B, Qwen3-8B, Qwen3-30B-A3B) are not measured here. Which points: gpu_plan.py (`--plan full`, the
whole set; `--plan one-run`, the shorter set of `run_gpu.sh all`).

Modes (engine cards engines/huggingface.yaml and engines/huggingface-compiled.yaml):
  eager     attn_implementation sdpa, DynamicCache, generate() as it comes
  compiled  a StaticCache passed to generate(), which compiles the decode forward with
            torch.compile(mode="reduce-overhead") (generation/utils.py _valid_auto_compile_criteria; the
            prefill runs eagerly into the static cache)
Metrics:
  ttft_ms         one forward over `batch` prompts of `prompt` tokens, logits of the last position only
                  (logits_to_keep=1): median of `repeats` after a warm-up
  decode_step_ms  (t(generate N2 tokens) - t(generate N1 tokens)) / (N2 - N1), min_new_tokens = max_new_tokens,
                  greedy: the prefill and first steps cancel; each t the median of `repeats`. Eager: the
                  DynamicCache grows over the steps (mean context prompt + (N1 + N2) / 2); compiled: both runs
                  use one StaticCache of capacity prompt + N2 (reset in between), so every step attends over it
Each point is written (and flushed) as soon as it is measured, self-contained: the cut config, mode, engine
card, hardware card, batch, lengths, metric, value, samples and the run's provenance. A point that fails
(out of memory, an error) is recorded as failed with its reason and the run goes on.

Time: `--budget` seconds from the start. The models run one after the other in the plan's order, each until
its own deadline (infersim.tabletools.bench.budget: its estimated time, gpu_plan.py, times gpu_plan.SAFETY, and
whatever earlier models left); a point whose estimate does not fit before its model's deadline is skipped
and said. SIGTERM ends the run the same way, keeping every point written. `--summary` gets what each model
planned, measured and left out, with timings.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from gpu_plan import (  # noqa: E402
    CONFIGS,
    FULL_PLAN,
    NEW_TOKENS,
    PLANS,
    REPEATS,
    SAFETY,
    SMOKE_NEW_TOKENS,
    SMOKE_REPEATS,
    ModelPlan,
    load_config,
    model_seconds,
    smoke_plan,
    smoke_widths,
)

from infersim.tabletools.bench.budget import PartRecord, StageSummary, fit_budgets, part_deadlines, part_status  # noqa: E402
from infersim.tabletools.bench.environment import module_version, read_clocks  # noqa: E402
from infersim.tabletools.bench.runner import hardware_card_for  # noqa: E402
from infersim.tables.table_files import plain  # noqa: E402

FORMAT = "infersim-gpu-validation-1"
ENGINES = {"eager": "huggingface", "compiled": "huggingface-compiled"}
MODELS = FULL_PLAN  # the whole validation set (count_eager_ops.py counts its models)
__all__ = ["MODELS", "ModelPlan", "load_config", "smoke_widths", "main"]


class Stopped(BaseException):
    """SIGTERM: a BaseException, so that a point's `except Exception` does not swallow it."""


# ---------------------------------------------------------------------------------------------
# Provenance and output


def git_commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(torch: Any, device: str, command: str, smoke: bool) -> dict[str, Any]:
    now = _dt.datetime.now(_dt.timezone.utc)
    out: dict[str, Any] = {
        "script": "benchmarks/gpu/measure_e2e.py", "command": command, "date": now.date().isoformat(),
        "started": now.isoformat(timespec="seconds"), "git_commit": git_commit(), "smoke": smoke,
        "python": sys.version.split()[0], "torch": str(torch.__version__),
        "transformers": module_version("transformers") or "unknown", "triton": module_version("triton") or "none",
    }
    if device.startswith("cuda"):
        clocks, driver = read_clocks()
        name = torch.cuda.get_device_name(0)
        out.update(device=name, hardware_card=hardware_card_for(name) or "unknown", driver=driver,
                   cuda=str(torch.version.cuda), cudnn=str(torch.backends.cudnn.version()), clocks=clocks)
    else:
        out.update(device="CPU (smoke run, no GPU)", hardware_card="h100-sxm", driver="none", cuda="none",
                   note="a CPU smoke run proves the script; its numbers are not a measurement of any GPU "
                        "(hardware_card h100-sxm only so that the file maps)")
    return plain(out)


class PointWriter:
    """The validation file, a YAML mapping whose `points` list grows by one flushed item per point."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        import yaml

        self.yaml = yaml
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("w", encoding="utf-8")
        self.handle.write(f"# GPU validation points (format {FORMAT}): benchmarks/gpu/measure_e2e.py; read by "
                          f"`python -m infersim validate --measured {path.name}`\n")
        self.handle.write(yaml.safe_dump(plain(header), sort_keys=False, width=110))
        self.handle.write("points:\n")
        self.handle.flush()
        self.count = 0

    def add(self, point: dict[str, Any]) -> None:
        self.handle.write(self.yaml.safe_dump([plain(point)], sort_keys=False, width=110))
        self.handle.flush()
        self.count += 1

    def close(self) -> None:
        self.handle.close()


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Session:
    torch: Any
    device: str
    repeats: int
    new_tokens: tuple[int, int]
    prov: dict[str, Any]
    writer: PointWriter
    summary: StageSummary
    log: Callable[[str], None]
    compile_on_cpu: bool = False
    failed: list[str] = field(default_factory=list)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def timed(self, run: Callable[[], Any], repeats: int | None = None) -> list[float]:
        """Seconds of `run`, synchronised around, after one warm-up call; `repeats` samples."""
        run()
        self.sync()
        samples = []
        for _ in range(repeats or self.repeats):
            self.sync()
            began = time.perf_counter()
            run()
            self.sync()
            samples.append(time.perf_counter() - began)
        return samples

    def not_measured(self, part: str, label: str, why: str) -> None:
        self.failed.append(f"{label}: {why}")
        self.summary.not_done(part, label, why)


def build_model(session: Session, config: dict[str, Any]) -> Any:
    torch = session.torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    with torch.device(session.device):  # random weights initialised on the device: seconds, not minutes
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


class ModelRun:
    """One model built in one mode, and the points measured on it."""

    def __init__(self, session: Session, plan: ModelPlan, mode: str, config: dict[str, Any], full_layers: int,
                 model: Any) -> None:
        self.session, self.plan, self.mode, self.config, self.model = session, plan, mode, config, model
        self.full_layers = full_layers
        from transformers import CompileConfig

        self.compile_config = CompileConfig(mode="reduce-overhead")  # generate()'s own default, named for the record
        if session.compile_on_cpu:
            self.compile_config._compile_all_devices = True  # smoke: exercise the compiled path on the CPU too

    def ids(self, batch: int, prompt: int) -> Any:
        return self.session.torch.randint(0, self.config["vocab_size"], (batch, prompt), device=self.session.device)

    def base(self, batch: int, prompt: int) -> dict[str, Any]:
        plan, layers = self.plan, self.config["num_hidden_layers"]
        return {
            "model": {"name": f"{plan.name}-{layers}l", "config": self.config, "source": f"benchmarks/gpu/configs/"
                      f"{plan.name}.json", "layers": layers, "full_layers": self.full_layers, "why": plan.why},
            "mode": self.mode, "engine": ENGINES[self.mode],
            "hardware": self.session.prov.get("hardware_card", "unknown"),
            "batch": batch, "prompt_tokens": prompt,
        }

    def record(self, batch: int, prompt: int, metric: str, samples_s: list[float], per: float,
               extra: dict[str, Any]) -> None:
        values = [s / per * 1e3 for s in samples_s]
        if statistics.median(values) <= 0:
            raise ValueError(f"the median of {metric} samples {values} is not positive (timing noise larger than "
                             f"the difference measured)")
        point = {"id": "", **self.base(batch, prompt), **extra, "metric": metric,
                 "value": round(statistics.median(values), 4), "unit": "ms",
                 "samples_ms": [round(v, 4) for v in values], "provenance": self.session.prov}
        point["id"] = point_id(self.session.prov, point)
        self.session.writer.add(point)
        self.session.log(f"  {point['id']}: {point['value']:.3f} ms")

    def ttft(self, batch: int, prompt: int) -> None:
        torch, inputs = self.session.torch, self.ids(batch, prompt)
        from transformers import DynamicCache, StaticCache

        def forward() -> None:
            cache = DynamicCache(config=self.model.config) if self.mode == "eager" else \
                StaticCache(config=self.model.config, max_cache_len=prompt + self.session.new_tokens[1])
            with torch.no_grad():
                self.model(input_ids=inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.record(batch, prompt, "ttft_ms", self.session.timed(forward), 1.0,
                    {"includes": "one forward (eager prefill): no generate() loop"})

    def decode(self, batch: int, prompt: int) -> None:
        session, torch, inputs = self.session, self.session.torch, self.ids(batch, prompt)
        n1, n2 = session.new_tokens
        from transformers import StaticCache

        static = StaticCache(config=self.model.config, max_cache_len=prompt + n2) if self.mode == "compiled" else None

        def generate(new: int) -> None:
            options: dict[str, Any] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
            if static is not None:
                static.reset()
                options["past_key_values"] = static
                options["compile_config"] = self.compile_config
                if not session.device.startswith("cuda") and not session.compile_on_cpu:
                    options["disable_compile"] = True  # generate compiles on CUDA only (smoke: the static path)
            with torch.no_grad():
                self.model.generate(inputs, **options)
        if static is not None:
            generate(n2)  # compiles the decode forward for this shape, and records its CUDA graph
        # two samples per length: a difference over 32 steps is far above the GPU's run-to-run spread,
        # and each generate() repeats the batch's prefill
        repeats = min(session.repeats, 2)
        short = session.timed(lambda: generate(n1), repeats)
        long = session.timed(lambda: generate(n2), repeats)
        extra: dict[str, Any] = {"new_tokens": [n1, n2], "mean_context": prompt + (n1 + n2) / 2,
                                 "includes": "generate() per step: forward, logits processing, stopping checks"}
        if static is not None:
            extra["kv_capacity"] = prompt + n2
        self.record(batch, prompt, "decode_step_ms", [b - a for a, b in zip(short, long)], float(n2 - n1), extra)

    def attempt(self, label: str, estimate: float, deadline: float, work: Callable[[], None]) -> None:
        """Run one point if its estimate fits before `deadline` (seconds after the run's start)."""
        session = self.session
        left = deadline - session.summary.elapsed()
        if estimate > left:
            session.not_measured(self.plan.name, label, f"skipped: estimated {estimate:.1f} s, {max(left, 0):.1f} s "
                                                        f"left of {self.plan.name}'s budget")
            session.log(f"  {label}: skipped (estimated {estimate:.1f} s, {max(left, 0):.1f} s left)")
            return
        try:
            work()
            session.summary.done_one(self.plan.name)
        except Exception as exc:  # noqa: BLE001 - one point failing (out of memory, an error) must not stop the set
            reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            session.not_measured(self.plan.name, label, f"failed: {reason}")
            session.log(f"  {label}: FAILED {reason}")
            if "out of memory" not in reason.lower():
                session.log(traceback.format_exc(limit=3))
        finally:
            if session.device.startswith("cuda"):
                session.torch.cuda.empty_cache()


def measure_model(session: Session, plan: ModelPlan, mode: str, smoke: bool, deadline: float) -> None:
    """Build one model and measure its points in order, each if its estimate fits before `deadline`."""
    torch = session.torch
    full = json.loads((CONFIGS / f"{plan.name}.json").read_text())["num_hidden_layers"]
    config = load_config(plan.name, plan.layers_for(mode), smoke)
    build, estimates = model_seconds(plan, mode, smoke, session.new_tokens, session.repeats)
    left = deadline - session.summary.elapsed()
    if build + min(seconds for _label, seconds in estimates) > left:
        for label, seconds in estimates:
            session.not_measured(plan.name, label, f"skipped: estimated {build:.1f} s to build the model and "
                                                   f"{seconds:.1f} s for the point, {max(left, 0):.1f} s left")
        session.log(f"{plan.name}: skipped ({max(left, 0):.1f} s left of its budget)")
        return
    began = time.perf_counter()
    run = ModelRun(session, plan, mode, config, full, build_model(session, config))
    session.log(f"{plan.name}: built {config['num_hidden_layers']} layers in {time.perf_counter() - began:.1f} s")
    for (metric, batch, prompt), (label, estimate) in zip(plan.points(mode), estimates):
        work = run.ttft if metric == "ttft_ms" else run.decode
        run.attempt(label, estimate, deadline, lambda work=work, batch=batch, prompt=prompt: work(batch, prompt))
    del run
    if mode == "compiled":
        torch._dynamo.reset()  # the compiled graphs and their CUDA-graph memory pools of this model


def point_id(prov: dict[str, Any], point: dict[str, Any]) -> str:
    device = "cpu-smoke" if prov.get("smoke") else str(prov.get("hardware_card", "gpu"))
    metric = "ttft" if point["metric"] == "ttft_ms" else "decode"
    return f"{device}-{point['model']['name']}-{point['mode']}-{metric}-b{point['batch']}-p{point['prompt_tokens']}"


# ---------------------------------------------------------------------------------------------
# The run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--out", type=Path, required=True, help="directory for the validation file and the log")
    parser.add_argument("--plan", choices=sorted(PLANS), default="full",
                        help="the points measured (gpu_plan.py): full (default) or one-run (run_gpu.sh all's)")
    parser.add_argument("--models", default="", help="comma-separated names (default: all of the plan's)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="tiny widths and lengths: proves the script, measures "
                                                             "nothing")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds from the start by which the run ends "
                                                                     "(default 540: inside a 10-minute command)")
    parser.add_argument("--summary", type=Path, default=None, help="write what each model planned, measured and left "
                                                                   "out, with timings, to this JSON file")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"timed samples per point, median kept (default {REPEATS})")
    parser.add_argument("--new-tokens", default=",".join(map(str, NEW_TOKENS)),
                        help="N1,N2 generated tokens differenced (default %(default)s)")
    parser.add_argument("--compile-on-cpu", action="store_true",
                        help="smoke: compile the decode forward on the CPU as well (slow; proves the compiled path)")
    return parser.parse_args(argv)


def chosen_plans(args: argparse.Namespace) -> list[ModelPlan] | str:
    """The plan's models to run in this mode (smoke: at tiny sizes), or why the names are wrong."""
    plans = PLANS[args.plan]
    wanted = [m for m in args.models.split(",") if m] or [p.name for p in plans]
    unknown = sorted(set(wanted) - {p.name for p in plans})
    if unknown:
        return f"unknown model(s) {', '.join(unknown)} (known: {', '.join(p.name for p in plans)})"
    chosen = [smoke_plan(p) if args.smoke else p for p in plans if p.name in wanted]
    return [p for p in chosen if p.points(args.mode)]


def new_summary(args: argparse.Namespace, plans: list[ModelPlan], n1: int, n2: int, repeats: int,
                elapsed: float) -> StageSummary:
    """One part per model: its points, its estimate (building it and each point) and its deadline."""
    parts, budgets = [], []
    for plan in plans:
        build, points = model_seconds(plan, args.mode, args.smoke, (n1, n2), repeats)
        estimate = build + sum(seconds for _label, seconds in points)
        parts.append(PartRecord(plan.name, len(points), round(estimate, 3),
                                estimate_source="gpu_plan.point_seconds and BUILD_SECONDS"))
        budgets.append((plan.name, SAFETY * estimate))
    window = max(args.budget - elapsed, 0.0)
    deadlines = part_deadlines(budgets, window)
    for part, (name, seconds) in zip(parts, fit_budgets(budgets, window)):
        part.budget_s, part.deadline_s = round(seconds, 3), round(deadlines[name], 3)
    return StageSummary(args.summary, "measure_e2e.py", round(window, 3), parts, mode=args.mode, plan=args.plan)


def run_models(session: Session, plans: list[ModelPlan], mode: str, smoke: bool) -> None:
    for plan in plans:
        part = session.summary.begin(plan.name)
        try:
            measure_model(session, plan, mode, smoke, part.deadline_s or 0.0)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be built must not stop the others
            session.not_measured(plan.name, plan.name, f"failed: {type(exc).__name__}: {str(exc)[:200]}")
            session.log(f"{plan.name}: FAILED {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
        session.summary.end(plan.name, part_status(part))
        if session.device.startswith("cuda"):
            session.torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    plans = chosen_plans(args)
    if isinstance(plans, str):
        print(f"measure_e2e: {plans}", file=sys.stderr)
        return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("measure_e2e: no CUDA GPU here (use --device cpu --smoke to check the script)", file=sys.stderr)
        return 2
    n1, n2 = SMOKE_NEW_TOKENS if args.smoke else tuple(int(x) for x in args.new_tokens.split(","))
    repeats = SMOKE_REPEATS if args.smoke else args.repeats
    command = shlex.join(["python3", "benchmarks/gpu/measure_e2e.py", *(argv if argv is not None else sys.argv[1:])])
    prov = provenance(torch, args.device, command, args.smoke)
    device_tag = str(prov["hardware_card"]) if not args.smoke else "cpu-smoke"
    out_file = args.out / f"e2e-{device_tag}-{args.mode}.yaml"
    args.out.mkdir(parents=True, exist_ok=True)
    log_file = (args.out / f"e2e-{device_tag}-{args.mode}.log").open("w", encoding="utf-8")

    def log(text: str) -> None:
        print(text, flush=True)
        log_file.write(text + "\n")
        log_file.flush()

    header = {"format": FORMAT, "provenance": prov,
              "method": {"ttft_ms": "one forward, logits_to_keep=1, median of repeats after a warm-up",
                         "decode_step_ms": f"(t(generate {n2}) - t(generate {n1})) / {n2 - n1}, greedy, "
                                           f"min_new_tokens = max_new_tokens, medians of {repeats}",
                         "compiled": "a StaticCache of capacity prompt + N2 passed to generate(), which compiles the "
                                     "decode forward (CompileConfig mode reduce-overhead); one generate() of N2 "
                                     "tokens first compiles it and records the CUDA graph"}}
    writer = PointWriter(out_file, header)
    summary = new_summary(args, plans, n1, n2, repeats, time.perf_counter() - started)
    session = Session(torch, args.device, repeats, (n1, n2), prov, writer, summary, log,
                      compile_on_cpu=args.compile_on_cpu)
    log(f"measure_e2e: {prov['device']} ({prov['hardware_card']}), torch {prov['torch']}, transformers "
        f"{prov['transformers']}, mode {args.mode}, plan {args.plan}; writing {out_file}")
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        run_models(session, plans, args.mode, args.smoke)
    except (Stopped, KeyboardInterrupt):
        session.failed.append("the rest: not reached (stopped by a signal)")
        summary.stop("stopped by a signal")
        log("measure_e2e: stopped by a signal; the points measured are written")
    finally:
        signal.signal(signal.SIGTERM, previous)
        # a key after the points list keeps the file one YAML mapping (a run killed before this line still loads)
        writer.handle.write(writer.yaml.safe_dump({"not_measured": session.failed}, sort_keys=False, width=110))
        writer.close()
        summary.write()
    log(f"measure_e2e: {writer.count} points in {time.perf_counter() - started:.0f} s; "
        f"{len(session.failed)} not measured" + (": " + "; ".join(session.failed) if session.failed else ""))
    log_file.close()
    return 0 if writer.count else 1


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped()


if __name__ == "__main__":
    raise SystemExit(main())
