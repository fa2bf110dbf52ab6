"""End-to-end GPU validation set: TTFT and per-step decode time of HF transformers on this GPU, written
as a validation file `python -m infersim validate` reads beside the public reference.

    python3 benchmarks/gpu/measure_e2e.py --mode eager --out $OUT --budget 540
    python3 benchmarks/gpu/measure_e2e.py --mode compiled --out $OUT --budget 540
    python3 benchmarks/gpu/measure_e2e.py --device cpu --smoke --out /tmp/e2e      # proves the script, measures nothing

No downloads: each model is built from the HF config.json in benchmarks/gpu/configs/ with random bf16 weights
(quantisation settings dropped), cut to a few layers so it fits one GPU (the simulator is given the same cut
config, so what is checked is the per-layer cost and the per-step overhead around it). The held-out models
(Llama-3.1-8B, Qwen3-8B, Qwen3-30B-A3B) are not measured here.

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
(out of memory, an error) is recorded as failed with its reason and the run goes on; --budget ends the run
before the command's time limit.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from infersim.tabletools.bench.runner import hardware_card_for  # noqa: E402
from infersim.tabletools.bench.environment import module_version, read_clocks  # noqa: E402
from infersim.tables.table_files import plain  # noqa: E402

CONFIGS = Path(__file__).resolve().parent / "configs"
FORMAT = "infersim-gpu-validation-1"
ENGINES = {"eager": "huggingface", "compiled": "huggingface-compiled"}


@dataclass(frozen=True)
class ModelPlan:
    """One model of the set: its config file, the layers kept, and the points measured on it."""

    name: str
    layers: int
    ttft: tuple[tuple[int, int], ...]  # (batch, prompt)
    decode: tuple[tuple[int, int], ...]  # (batch, prompt)
    compiled_decode: tuple[tuple[int, int], ...] = ()
    why: str = ""
    compiled_layers: int = 0  # layers kept in compiled mode (0: `layers`): Inductor's compile time grows with them


# Layers kept: the fewest that leave each model's kinds of layer in place and fit 78 GiB with its
# caches at the largest point (bf16 weights; DeepSeek-V3 keeps its 3 dense layers and one MoE layer).
MODELS = (
    ModelPlan("llama-3.1-70b", 8, ((1, 128), (1, 1024), (1, 8192), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 1024), (8, 8192)), ((1, 1024), (32, 1024)),
              "dense GQA (64 query, 8 KV heads), 8 of 80 layers"),
    ModelPlan("llama-2-7b", 32, ((1, 128), (1, 1024), (1, 4096), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 512)), ((1, 1024), (32, 1024)),
              "dense MHA (32 heads), all 32 layers (8 in compiled mode, for the compile time)", compiled_layers=8),
    ModelPlan("mixtral-8x7b", 8, ((1, 128), (1, 1024), (1, 8192), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 1024)), ((1, 1024), (32, 1024)),
              "MoE, 8 experts top-2, GQA, 8 of 32 layers"),
    ModelPlan("qwen3-235b-a22b", 4, ((1, 128), (1, 1024), (1, 8192), (8, 1024)),
              ((1, 1024), (16, 1024), (64, 1024), (128, 1024)), ((1, 1024), (32, 1024)),
              "MoE, 128 experts top-8, GQA with q/k norms, 4 of 94 layers"),
    ModelPlan("deepseek-v3", 4, ((1, 128), (1, 1024), (1, 4096)),
              ((1, 1024), (16, 1024)), ((1, 1024),),
              "MLA + MoE (256 experts top-8, a shared expert), 3 dense + 1 MoE of 61 layers"),
)


def load_config(name: str, layers: int, smoke: bool) -> dict[str, Any]:
    """The model's HF config, cut to `layers` layers, without its quantisation (random bf16 weights)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    for key in ("quantization_config", "auto_map", "_name_or_path"):
        config.pop(key, None)
    # transformers' DeepseekV3Config names these n_routed_experts and n_shared_experts; the copied config uses the
    # longer names, which it would ignore (and fall back to its defaults)
    for longer, hf_name in (("num_routed_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts")):
        if config.get("model_type") == "deepseek_v3" and longer in config:
            config.setdefault(hf_name, config.pop(longer))
    config["num_hidden_layers"] = layers
    config["torch_dtype"] = "bfloat16"
    if smoke:
        config.update(smoke_widths(config))
    return config


def smoke_widths(config: dict[str, Any]) -> dict[str, Any]:
    """Tiny widths of the same architecture for a CPU smoke run (numbers mean nothing; code paths do)."""
    heads = 4
    kv = 4 if config.get("num_key_value_heads", heads) == config.get("num_attention_heads") else 2
    out: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": heads,
                           "num_key_value_heads": kv, "vocab_size": 512, "head_dim": 32,
                           "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1}
    if "moe_intermediate_size" in config:
        out["moe_intermediate_size"] = 64
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if key in config:
            out[key] = 8
    if "num_experts_per_tok" in config:
        out["num_experts_per_tok"] = 2
    if config.get("kv_lora_rank"):
        out.update(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                   head_dim=16, n_group=2, topk_group=1, num_key_value_heads=heads)
    return out


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
    budget_end: float
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


def point_base(session: Session, plan: ModelPlan, config: dict[str, Any], mode: str, batch: int, prompt: int,
               full_layers: int) -> dict[str, Any]:
    return {
        "model": {"name": f"{plan.name}-{plan.layers}l", "config": config, "source": f"benchmarks/gpu/configs/"
                  f"{plan.name}.json", "layers": plan.layers, "full_layers": full_layers, "why": plan.why},
        "mode": mode, "engine": ENGINES[mode], "hardware": session.prov.get("hardware_card", "unknown"),
        "batch": batch, "prompt_tokens": prompt,
    }


def measure_model(session: Session, plan: ModelPlan, mode: str, smoke: bool) -> None:
    torch = session.torch
    full = json.loads((CONFIGS / f"{plan.name}.json").read_text())["num_hidden_layers"]
    layers = plan.compiled_layers if mode == "compiled" and plan.compiled_layers else plan.layers
    if smoke:
        layers = 2 if plan.name == "deepseek-v3" else 1
    plan = ModelPlan(plan.name, layers, plan.ttft, plan.decode, plan.compiled_decode, plan.why)
    config = load_config(plan.name, plan.layers, smoke)
    if smoke and plan.name == "deepseek-v3":
        config["first_k_dense_replace"] = 1
    began = time.perf_counter()
    model = build_model(session, config)
    session.log(f"{plan.name}: built {plan.layers} layers in {time.perf_counter() - began:.1f} s")
    vocab = config["vocab_size"]
    n1, n2 = session.new_tokens

    def ids(batch: int, prompt: int) -> Any:
        return torch.randint(0, vocab, (batch, prompt), device=session.device)

    def record(base: dict[str, Any], metric: str, samples_s: list[float], per: float, extra: dict[str, Any]) -> None:
        values = [s / per * 1e3 for s in samples_s]
        if statistics.median(values) <= 0:
            raise ValueError(f"the median of {metric} samples {values} is not positive (timing noise larger than "
                             f"the difference measured)")
        point = {"id": "", **base, **extra, "metric": metric, "value": round(statistics.median(values), 4),
                 "unit": "ms", "samples_ms": [round(v, 4) for v in values], "provenance": session.prov}
        point["id"] = point_id(session.prov, point)
        session.writer.add(point)
        session.log(f"  {point['id']}: {point['value']:.3f} ms")

    def attempt(label: str, work: Callable[[], None]) -> None:
        if time.perf_counter() > session.budget_end:
            session.failed.append(f"{label}: not reached (time budget)")
            return
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - one point failing (out of memory, an error) must not stop the set
            reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            session.failed.append(f"{label}: {reason}")
            session.log(f"  {label}: FAILED {reason}")
            if "out of memory" not in reason.lower():
                session.log(traceback.format_exc(limit=3))
        finally:
            if session.device.startswith("cuda"):
                torch.cuda.empty_cache()

    from transformers import CompileConfig, DynamicCache, StaticCache

    compile_config = CompileConfig(mode="reduce-overhead")  # generate()'s own default, named for the record
    if session.compile_on_cpu:
        compile_config._compile_all_devices = True  # smoke: exercise the compiled path on the CPU too

    for batch, prompt in plan.ttft:
        def ttft(batch: int = batch, prompt: int = prompt) -> None:
            inputs = ids(batch, prompt)

            def forward() -> None:
                cache = DynamicCache(config=model.config) if mode == "eager" else \
                    StaticCache(config=model.config, max_cache_len=prompt + n2)
                with torch.no_grad():
                    model(input_ids=inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
            record(point_base(session, plan, config, mode, batch, prompt, full), "ttft_ms", session.timed(forward),
                   1.0, {"includes": "one forward (eager prefill): no generate() loop"})
        attempt(f"{plan.name} ttft batch {batch} prompt {prompt}", ttft)

    decode_points = plan.decode if mode == "eager" else plan.compiled_decode
    for batch, prompt in decode_points:
        def decode(batch: int = batch, prompt: int = prompt) -> None:
            inputs = ids(batch, prompt)
            static = StaticCache(config=model.config, max_cache_len=prompt + n2) if mode == "compiled" else None

            def generate(new: int) -> None:
                options: dict[str, Any] = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                               pad_token_id=0)
                if static is not None:
                    static.reset()
                    options["past_key_values"] = static
                    options["compile_config"] = compile_config
                    if not session.device.startswith("cuda") and not session.compile_on_cpu:
                        options["disable_compile"] = True  # generate compiles on CUDA only (smoke: the static path)
                with torch.no_grad():
                    model.generate(inputs, **options)
            if mode == "compiled":
                generate(n2)  # compiles the decode forward for this shape, and records its CUDA graph
            # two samples per length: a difference over 32 steps is far above the GPU's run-to-run spread,
            # and each generate() repeats the batch's prefill
            repeats = min(session.repeats, 2)
            short = session.timed(lambda: generate(n1), repeats)
            long = session.timed(lambda: generate(n2), repeats)
            samples = [(b - a) for a, b in zip(short, long)]
            extra = {"new_tokens": [n1, n2], "mean_context": prompt + (n1 + n2) / 2,
                     "includes": "generate() per step: forward, logits processing, stopping checks"}
            if static is not None:
                extra["kv_capacity"] = prompt + n2
            record(point_base(session, plan, config, mode, batch, prompt, full), "decode_step_ms", samples,
                   float(n2 - n1), extra)
        attempt(f"{plan.name} decode batch {batch} prompt {prompt}", decode)
    del model
    if mode == "compiled":
        torch._dynamo.reset()  # the compiled graphs and their CUDA-graph memory pools of this model


def point_id(prov: dict[str, Any], point: dict[str, Any]) -> str:
    device = "cpu-smoke" if prov.get("smoke") else str(prov.get("hardware_card", "gpu"))
    metric = "ttft" if point["metric"] == "ttft_ms" else "decode"
    return f"{device}-{point['model']['name']}-{point['mode']}-{metric}-b{point['batch']}-p{point['prompt_tokens']}"


def smoke_plan(plan: ModelPlan) -> ModelPlan:
    return ModelPlan(plan.name, plan.layers, ((1, 16), (2, 32)), ((1, 16), (2, 16)), ((2, 16),), plan.why,
                     plan.compiled_layers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    parser.add_argument("--out", type=Path, required=True, help="directory for the validation file and the log")
    parser.add_argument("--models", default="", help="comma-separated names (default: all five)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="tiny widths and lengths: proves the script, measures "
                                                             "nothing")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds after which no new point starts "
                                                                     "(default 540: inside a 10-minute command)")
    parser.add_argument("--repeats", type=int, default=3, help="timed samples per point, median kept (default 3)")
    parser.add_argument("--new-tokens", default="8,40", help="N1,N2 generated tokens differenced (default 8,40)")
    parser.add_argument("--compile-on-cpu", action="store_true",
                        help="smoke: compile the decode forward on the CPU as well (slow; proves the compiled path)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("measure_e2e: no CUDA GPU here (use --device cpu --smoke to check the script)", file=sys.stderr)
        return 2
    n1, n2 = (int(x) for x in args.new_tokens.split(","))
    if args.smoke:
        n1, n2 = 2, 4
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
                                           f"min_new_tokens = max_new_tokens, medians of {args.repeats}",
                         "compiled": "a StaticCache of capacity prompt + N2 passed to generate(), which compiles the "
                                     "decode forward (CompileConfig mode reduce-overhead); one generate() of N2 "
                                     "tokens first compiles it and records the CUDA graph"}}
    writer = PointWriter(out_file, header)
    session = Session(torch, args.device, 1 if args.smoke else args.repeats, (n1, n2), prov, writer,
                      started + args.budget, log, compile_on_cpu=args.compile_on_cpu)
    wanted = [m for m in args.models.split(",") if m] or [p.name for p in MODELS]
    unknown = sorted(set(wanted) - {p.name for p in MODELS})
    if unknown:
        print(f"measure_e2e: unknown model(s) {', '.join(unknown)} (known: {', '.join(p.name for p in MODELS)})",
              file=sys.stderr)
        return 2
    log(f"measure_e2e: {prov['device']} ({prov['hardware_card']}), torch {prov['torch']}, transformers "
        f"{prov['transformers']}, mode {args.mode}; writing {out_file}")
    for plan in MODELS:
        if plan.name not in wanted:
            continue
        if time.perf_counter() > session.budget_end:
            session.failed.append(f"{plan.name}: not reached (time budget)")
            continue
        try:
            measure_model(session, smoke_plan(plan) if args.smoke else plan, args.mode, args.smoke)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be built must not stop the others
            session.failed.append(f"{plan.name}: {type(exc).__name__}: {str(exc)[:200]}")
            log(f"{plan.name}: FAILED {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    # a key after the points list keeps the file one YAML mapping (a run killed before this line still loads)
    writer.handle.write(writer.yaml.safe_dump({"not_measured": session.failed}, sort_keys=False, width=110))
    writer.close()
    log(f"measure_e2e: {writer.count} points in {time.perf_counter() - started:.0f} s; "
        f"{len(session.failed)} not measured" + (": " + "; ".join(session.failed) if session.failed else ""))
    log_file.close()
    return 0 if writer.count else 1


if __name__ == "__main__":
    raise SystemExit(main())
