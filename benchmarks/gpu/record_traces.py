"""Record the PyTorch-profiler (Kineto) traces that `compare --trace` and `mfu from-trace` are
checked on: HF transformers models with random weights, cut to a few layers, TP=1.

    python benchmarks/gpu/record_traces.py --out $OUT            # on a GPU: every variant, then the checks
    python benchmarks/gpu/record_traces.py --out /tmp/t --quick  # on a CPU: CPU-only traces, small shapes

For each model (dense Llama-2-7B, MoE Mixtral-8x7B: the bundled cards' shapes, `--layers` of them)
and each mode it writes one gzipped trace with one prefill step and `--decode-steps` decode
steps, each inside `torch.profiler.record_function("prefill")` / `("decode")`, recorded with
`record_shapes=True, with_stack=True`:

- `eager`:    the HF model as it runs by default (SDPA attention, DynamicCache, grouped_mm experts);
- `compiled`: `torch.compile` of the forward (Inductor: Triton kernels, extern cuBLAS GEMMs) over a
              StaticCache;
- `graphs`:   the same with `mode="reduce-overhead"` (CUDA graphs: one `cudaGraphLaunch` per step);
              GPU only.
In the compiled modes the prefill is compiled too, unless `--eager-prefill`: then it runs eagerly into the
StaticCache, as `generate()` runs it (the `huggingface-compiled` engine card's prefill), and only the decode
shape is compiled.

Two shape sets per model: `main` (prefill 1 x 2048 tokens, decode batch 8 at a 2048-token context
on a GPU) and `other` (prefill 1 x 1024, decode batch 16): kernel tables learned from `main` are
checked against `other`. On a CPU the shapes shrink (`--quick`).

Beside each trace: the HF config.json of the cut model and a run config (`*.run.yaml`) describing
the same workload, so that `python -m infersim compare --trace T --config T.run.yaml` predicts
what was traced. With `--check` (default on a GPU) the script then runs, for every trace,
`compare --trace` (text and JSON) and, per model, `mfu from-trace` on the eager `main` trace and
the prediction of both shape sets with the learned tables, and writes `checks.md` with the
numbers to look at. Nothing is downloaded: configs are built from the model cards in models/.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from gpu_plan import SAFETY, trace_seconds  # noqa: E402

from infersim.tabletools.bench.budget import PartRecord, StageSummary, fit_budgets, part_deadlines, part_status  # noqa: E402

# models: bundled card -> HF architecture. Not Llama-3.1-8B, Qwen3-8B or Qwen3-30B-A3B (held out).
MODELS = {
    "llama-2-7b": "llama",
    "mixtral-8x7b": "mixtral",
}


@dataclass(frozen=True)
class Shapes:
    name: str
    prefill_batch: int
    prompt: int
    decode_batch: int


GPU_SHAPES = (Shapes("main", 1, 2048, 8), Shapes("other", 1, 1024, 16))
CPU_SHAPES = (Shapes("main", 1, 128, 2), Shapes("other", 1, 64, 4))


def read_card(name: str) -> dict:
    """The numbers of a bundled model card (plain `key: value  # comment` lines)."""
    card: dict = {}
    for line in (REPO / "models" / f"{name}.yaml").read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if ":" not in text:
            continue
        key, value = (part.strip() for part in text.split(":", 1))
        if value.lower() in ("true", "false"):
            card[key] = value.lower() == "true"
        else:
            try:
                card[key] = int(value)
            except ValueError:
                card[key] = value
    return card


def config_fields(name: str, layers: int, tiny: bool = False) -> dict:
    """The HF config of a bundled model card cut to `layers` layers, as plain fields (model_type first)."""
    card = read_card(name)
    if tiny:  # a smoke test of the script's paths, not a trace of the model
        card = {**card, "hidden_size": 256, "head_dim": 64, "num_attention_heads": 4,
                "num_key_value_heads": 4 if card["num_key_value_heads"] == card["num_attention_heads"] else 2,
                "vocab_size": 1000, "intermediate_size": 512, "moe_intermediate_size": 512}
    common = dict(model_type=MODELS[name], hidden_size=card["hidden_size"], num_hidden_layers=layers,
                  num_attention_heads=card["num_attention_heads"], num_key_value_heads=card["num_key_value_heads"],
                  head_dim=card["head_dim"], vocab_size=card["vocab_size"],
                  tie_word_embeddings=card.get("tie_word_embeddings", False), max_position_embeddings=32768)
    if MODELS[name] == "llama":
        return dict(common, intermediate_size=card["intermediate_size"])
    return dict(common, intermediate_size=card["moe_intermediate_size"], num_local_experts=card["num_experts"],
                num_experts_per_tok=card["num_experts_per_tok"])


def hf_config(name: str, layers: int, tiny: bool = False):  # -> transformers.PretrainedConfig
    import transformers

    fields = config_fields(name, layers, tiny)
    kind = fields.pop("model_type")
    return (transformers.LlamaConfig if kind == "llama" else transformers.MixtralConfig)(**fields)


def build_model(name: str, layers: int, device: str, tiny: bool = False):
    import torch
    import transformers

    config = hf_config(name, layers, tiny)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval(), config


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class Runner:
    """Prefill and decode forwards of one model in one mode."""

    def __init__(self, model, config, mode: str, device: str, shapes: Shapes, decode_steps: int) -> None:
        import torch

        self.torch = torch
        self.model, self.config, self.mode, self.device = model, config, mode, device
        self.shapes, self.decode_steps = shapes, decode_steps
        self.forward = model  # called as a module, so that its nn.Module frame marks each forward pass
        if mode != "eager":
            torch._dynamo.config.cache_size_limit = 64
            self.forward = torch.compile(model, mode="reduce-overhead" if mode == "graphs" else "default",
                                         dynamic=False)

    def tokens(self, batch: int, length: int):
        return self.torch.randint(0, self.config.vocab_size, (batch, length), device=self.device)

    def new_cache(self, batch: int):
        import transformers

        if self.mode == "eager":
            return transformers.DynamicCache(config=self.config)
        return transformers.StaticCache(config=self.config, max_cache_len=self.shapes.prompt + self.decode_steps + 8)

    def prefill(self, batch: int, cache, compiled: bool = True):
        """One prompt step; compiled=False runs the module eagerly (building a decode batch's cache
        without compiling a shape the trace does not time)."""
        torch = self.torch
        length = self.shapes.prompt
        kwargs = {}
        if self.mode != "eager":
            kwargs["cache_position"] = torch.arange(length, device=self.device)
        # logits of the last position only, as generate() asks for them
        forward = self.forward if compiled else self.model
        out = forward(input_ids=self.tokens(batch, length), past_key_values=cache, use_cache=True,
                      logits_to_keep=1, **kwargs)
        return out.logits[:, -1:].argmax(-1)

    def decode(self, token, cache, position: int):
        torch = self.torch
        kwargs = {}
        if self.mode != "eager":
            kwargs["cache_position"] = torch.tensor([position], device=self.device)
        out = self.forward(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1, **kwargs)
        return out.logits[:, -1:].argmax(-1)


def record(name: str, mode: str, shapes: Shapes, args: argparse.Namespace, out: Path) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    device = args.device
    model, config = build_model(name, args.layers, device, args.tiny)
    runner = Runner(model, config, mode, device, shapes, args.decode_steps)
    with torch.no_grad():
        # warm-up (compile, autotune, capture, allocate) of the two timed shapes; the decode batch's
        # context is filled eagerly, outside the profile
        decode_cache = runner.new_cache(shapes.decode_batch)
        first = runner.prefill(shapes.decode_batch, decode_cache, compiled=False)
        for _ in range(2 if mode == "eager" else 3):
            token = first
            for step in range(args.decode_steps):
                token = runner.decode(token, decode_cache, shapes.prompt + step)
            runner.prefill(shapes.prefill_batch, runner.new_cache(shapes.prefill_batch), not args.eager_prefill)
        token = first
        prefill_cache = runner.new_cache(shapes.prefill_batch)
        sync(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities, record_shapes=True, with_stack=True) as prof:
            import transformers

            for key, value in (("torch_version", torch.__version__), ("transformers_version", transformers.__version__),
                               ("recorded_model", f"{name} cut to {args.layers} layers, random weights, bf16"),
                               ("recorded_mode", mode), ("recorded_shapes", str(shapes)),
                               ("recorded_prefill", "eager" if mode == "eager" or args.eager_prefill else mode),
                               ("recorded_by", "benchmarks/gpu/record_traces.py")):
                prof.add_metadata(key, value)
            with record_function("prefill"):
                runner.prefill(shapes.prefill_batch, prefill_cache, not args.eager_prefill)
                sync(device)
            for step in range(args.decode_steps):
                with record_function("decode"):
                    token = runner.decode(token, decode_cache, shapes.prompt + step)
                    sync(device)
    stem = (f"{name}-{args.layers}l-{mode}-{device_tag(device)}-p{shapes.prefill_batch}x"
            f"{shapes.prompt}-d{shapes.decode_batch}")
    plain = out / f"{stem}.json"
    prof.export_chrome_trace(str(plain))
    path = out / f"{stem}.json.gz"
    with plain.open("rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()
    config.to_json_file(str(out / f"{name}-{args.layers}l.config.json"))
    write_run_config(out / run_config_name(name, args.layers, shapes), name, args, shapes, device)
    del model, runner
    if device == "cuda":
        torch.cuda.empty_cache()
    return path


def run_config_name(name: str, layers: int, shapes: Shapes) -> str:
    """The run config of a model and shape set (shared by the modes and devices that traced it)."""
    return f"{name}-{layers}l-p{shapes.prefill_batch}x{shapes.prompt}-d{shapes.decode_batch}.run.yaml"


def run_config_of(trace: Path) -> Path:
    """trace <model>-<L>l-<mode>-<device>-p<B>x<S>-d<B>.json.gz -> its run config."""
    parts = trace.name.removesuffix(".json.gz").split("-")
    return trace.with_name("-".join(parts[:-4] + parts[-2:]) + ".run.yaml")


def device_tag(device: str) -> str:
    import torch

    if device != "cuda":
        return "cpu"
    return torch.cuda.get_device_name().lower().replace("nvidia ", "").split()[0]


def hardware_card(device: str) -> str:
    import torch

    if device != "cuda":
        return "h100-sxm"  # a CPU trace has no GPU: the card only makes the run config complete
    name = torch.cuda.get_device_name().lower()
    for key, card in (("h200", "h200"), ("h100", "h100-sxm"), ("h800", "h800"), ("h20", "h20"), ("b200", "b200"),
                      ("a100", "a100-sxm-80g")):
        if key in name:
            return card
    return "h100-sxm"


def write_run_config(path: Path, name: str, args: argparse.Namespace, shapes: Shapes, device: str) -> None:
    path.write_text(
        f"# The workload of the trace beside this file (written by benchmarks/gpu/record_traces.py).\n"
        f"# Decode steps attend to prompt + 1 .. prompt + {args.decode_steps} tokens: isl + osl/2 is their mean.\n"
        f"model: {name}-{args.layers}l.config.json\n"
        f"hardware: {hardware_card(device)}\n"
        f"engine: huggingface\n"
        f"deployment: {{num_gpus: 1, attention: {{tp: 1}}, ffn: {{tp: 1, ep: 1}}, precision: {{gemm: bf16, kv_cache: bf16}}}}\n"
        f"workload: {{isl: {shapes.prompt}, osl: {args.decode_steps + 1}, "
        f"prefill_tokens_per_gpu: {shapes.prefill_batch * shapes.prompt}, decode_batch_per_gpu: {shapes.decode_batch}}}\n")


def run_checks(out: Path, traces: list[Path], args: argparse.Namespace) -> None:
    """compare --trace on every trace; mfu from-trace on each model's eager main trace, then the
    prediction of both shape sets with the learned tables. Findings go to checks.md."""
    lines = ["# Checks of the recorded traces (benchmarks/gpu/record_traces.py)", ""]

    def infersim(*argv: str) -> tuple[int, str]:
        proc = subprocess.run([sys.executable, "-m", "infersim", *argv], cwd=REPO, capture_output=True, text=True)
        return proc.returncode, proc.stdout + proc.stderr

    def engine_of(trace: Path) -> list[str]:
        """The engine card of the mode traced: compiled and graph-replayed runs are huggingface-compiled's
        (whose prefill is eager as generate() runs it, where this script compiles the prefill too)."""
        compiled = "-compiled-" in trace.name or "-graphs-" in trace.name
        return ["--set", "engine=huggingface-compiled"] if compiled else []

    for trace in traces:
        run = run_config_of(trace)
        code, text = infersim("compare", "--trace", str(trace), "--config", str(run), *engine_of(trace))
        (out / (trace.name.replace(".json.gz", ".compare.txt"))).write_text(text)
        code_json, text_json = infersim("compare", "--trace", str(trace), "--config", str(run), "--format", "json",
                                        *engine_of(trace))
        (out / (trace.name.replace(".json.gz", ".compare.json"))).write_text(text_json)
        lines += [f"## {trace.name}", "", f"compare exit status {code}", "", "```", text[-6000:], "```", ""]
    for name in args.models:
        mains = [t for t in traces if t.name.startswith(f"{name}-") and "-eager-" in t.name
                 and f"-p{args.shapes[0].prefill_batch}x{args.shapes[0].prompt}-" in t.name]
        if not mains:
            continue
        main = mains[0]
        run = run_config_of(main)
        tables = out / f"{name}-tables"
        code, text = infersim("mfu", "from-trace", str(main), "--config", str(run), "--out", str(tables))
        lines += [f"## mfu from-trace {main.name}", "", f"exit status {code}", "", "```", text[-4000:], "```", ""]
        for trace in traces:
            if trace.name.startswith(f"{name}-") and "-eager-" in trace.name:
                other_run = run_config_of(trace)
                code, text = infersim("compare", "--trace", str(trace), "--config", str(other_run), "--mfu-tables",
                                      str(tables))
                (out / trace.name.replace(".json.gz", ".learned.txt")).write_text(text)
                lines += [f"## {trace.name} predicted with the tables learned from {main.name}", "",
                          f"exit status {code}", "", "```", text[-6000:], "```", ""]
    (out / "checks.md").write_text("\n".join(lines))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "traces")),
                        help="output directory (default: $OUT, else ./traces)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    parser.add_argument("--modes", default=None, help="eager,compiled,graphs (default: all on a GPU, eager on a CPU)")
    parser.add_argument("--shape-sets", default="main,other",
                        help="main and/or other (default both; compiled modes trace main only)")
    parser.add_argument("--eager-prefill", action="store_true",
                        help="compiled modes: run the prefill eagerly, as generate() does (only the decode is "
                             "compiled)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers kept (default 2)")
    parser.add_argument("--decode-steps", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="the small CPU shapes even on a GPU")
    parser.add_argument("--tiny", action="store_true",
                        help="smoke test: the models shrunk to width 256 (checks the script, traces nothing useful)")
    parser.add_argument("--budget", type=float, default=420.0,
                        help="seconds from the start by which recording ends: a variant whose estimate (gpu_plan."
                             "trace_seconds) does not fit before its deadline is skipped (default 420: the checks and "
                             "a 10-minute command need the rest)")
    parser.add_argument("--summary", type=Path, default=None,
                        help="write what each variant did, with timings, to this JSON file")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                        help="run compare / mfu from-trace on the traces (default: on a GPU)")
    return parser.parse_args(argv)


def variants(args: argparse.Namespace, modes: list[str]) -> list[tuple[str, str, Shapes]]:
    """(model, mode, shapes): eager traces first (every model, the shape sets asked for), then the compiled
    modes on the main shapes: what the time budget leaves out is the least needed."""
    wanted = {s.strip() for s in args.shape_sets.split(",")}
    return [(name, mode, shapes) for mode in modes for name in args.models for shapes in args.shapes
            if shapes.name in wanted and (mode == "eager" or shapes.name == "main")]


def variant_name(name: str, mode: str, shapes: Shapes) -> str:
    return f"{name} {mode} {shapes.name}"


def new_summary(args: argparse.Namespace, plan: list[tuple[str, str, Shapes]], elapsed: float) -> StageSummary:
    """One part per variant, its estimate (gpu_plan.trace_seconds), budget and deadline."""
    parts, budgets = [], []
    for name, mode, shapes in plan:
        fields = config_fields(name, args.layers, args.tiny)
        estimate = trace_seconds(mode, args.layers, shapes.prompt, shapes.decode_batch, args.decode_steps, fields,
                                 compiled_prefill=not args.eager_prefill)
        label = variant_name(name, mode, shapes)
        parts.append(PartRecord(label, 1, round(estimate, 3), estimate_source="gpu_plan.trace_seconds"))
        budgets.append((label, SAFETY * estimate))
    window = max(args.budget - elapsed, 0.0)
    deadlines = part_deadlines(budgets, window)
    for part, (label, seconds) in zip(parts, fit_budgets(budgets, window)):
        part.budget_s, part.deadline_s = round(seconds, 3), round(deadlines[label], 3)
    return StageSummary(args.summary, "record_traces.py", round(window, 3), parts)


class Recorded:
    """recorded.json: the traces written, failed and skipped, rewritten after each variant."""

    def __init__(self, path: Path, torch: Any, on_gpu: bool) -> None:
        self.path = path
        self.head = {"torch": str(torch.__version__), "device": torch.cuda.get_device_name() if on_gpu else "cpu",
                     "cuda": torch.version.cuda}
        self.traces: list[Path] = []
        self.failed: list[str] = []
        self.skipped: list[str] = []
        self.stopped = ""

    def write(self) -> None:
        self.path.write_text(json.dumps({**self.head, "traces": [p.name for p in self.traces], "failed": self.failed,
                                         "skipped (time budget)": self.skipped, "stopped": self.stopped}, indent=2))


def record_all(plan: list[tuple[str, str, Shapes]], args: argparse.Namespace, summary: StageSummary,
               recorded: Recorded) -> None:
    for name, mode, shapes in plan:
        label = variant_name(name, mode, shapes)
        part = summary.begin(label)
        left = (part.deadline_s or 0.0) - summary.elapsed()
        if part.estimate_s > left:
            why = f"skipped: estimated {part.estimate_s:.1f} s, {max(left, 0):.1f} s left"
            recorded.skipped.append(f"{label}: {why}")
            summary.not_done(label, label, why)
            print(f"{label}: {why}", flush=True)
        else:
            t0 = time.perf_counter()
            try:
                path = record(name, mode, shapes, args, args.out)
                recorded.traces.append(path)
                summary.done_one(label)
                print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB in {time.perf_counter() - t0:.0f} s",
                      flush=True)
            except Exception as exc:  # one variant failing (an API change, memory) must not lose the others
                recorded.failed.append(f"{label}: {type(exc).__name__}: {exc}")
                summary.not_done(label, label, f"failed: {type(exc).__name__}: {str(exc)[:200]}")
                print(f"FAILED {label}: {type(exc).__name__}: {exc}", flush=True)
        summary.end(label, part_status(part))
        recorded.write()


class Stopped(BaseException):
    """SIGTERM: a BaseException, so that a variant's `except Exception` does not swallow it."""


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = args.device == "cuda"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise SystemExit(f"record_traces.py: --models: unknown {unknown[0]!r} (known: {', '.join(MODELS)})")
    modes = [m.strip() for m in (args.modes or ("eager,compiled,graphs" if on_gpu else "eager")).split(",")]
    if "graphs" in modes and not on_gpu:
        raise SystemExit("record_traces.py: --modes graphs needs a GPU (CUDA graphs)")
    args.shapes = CPU_SHAPES if (args.quick or not on_gpu) else GPU_SHAPES
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if on_gpu else "") + f", python {platform.python_version()}",
          flush=True)
    plan = variants(args, modes)
    summary = new_summary(args, plan, time.perf_counter() - started)
    recorded = Recorded(args.out / "recorded.json", torch, on_gpu)
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        record_all(plan, args, summary, recorded)
    except (Stopped, KeyboardInterrupt):
        recorded.stopped = "stopped by a signal: the variant being recorded is lost, the ones before are kept"
        summary.stop("stopped by a signal")
        print(f"record_traces.py: {recorded.stopped}", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        recorded.write()
        summary.write()
    if args.check if args.check is not None else on_gpu:
        run_checks(args.out, recorded.traces, args)
        print(f"checks written to {args.out / 'checks.md'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
