"""The `generate:` section of a run YAML: batch, lengths and what is offloaded.

The core config loader does not know this section, so it is taken out of the YAML here, merged
with `--set generate.x=...` overrides and the command-line flags (flags win), validated with the
card schema, and the rest of the YAML goes to `config_from_mapping` unchanged.

    generate:
      batch: 64              # sequences generated together (all GPUs)
      prompt_len: 2048       # default: workload.isl
      gen_len: 128           # default: workload.osl; the first token comes from prefill
      offload: [weights, kv] # or "weights,kv", "weights", "kv", "none"
      offload_device: cpu    # where offloaded weights live: cpu or nvme (the KV cache stays in CPU memory)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from infersim.cards.deployment import Deployment, attention_dp
from infersim.cards.schema import build, spec
from infersim.run.config import RunConfig, config_from_mapping, parse_overrides, read_run_mapping
from infersim.base.errors import MISSING, ConfigError
from infersim.run.flags import RunFlags

OffloadTarget = Literal["weights", "kv"]
SECTION = "generate"


@dataclass(frozen=True, kw_only=True)
class GenerateSpec:
    # batch / lengths carry no range in the schema: resolve() checks them with messages that say why
    batch: int | None = spec(None, doc="sequences generated together over all GPUs "
                                       "(default: workload.decode_batch_per_gpu x num_gpus)")
    prompt_len: int | None = spec(None, doc="prompt tokens per sequence (default: workload.isl)")
    gen_len: int | None = spec(None, doc="generated tokens per sequence, the first one by prefill (default: workload.osl)")
    offload: tuple[OffloadTarget, ...] = spec((), doc="what lives off the GPU and is streamed over PCIe every "
                                                      "forward pass: weights, kv (none = everything on the GPU)")
    offload_device: Literal["cpu", "nvme"] = spec(
        "cpu", doc="where offloaded weights live; nvme reads them at the card's nvme_bandwidth (KV cache: CPU memory)")
    prefetch: bool = spec(True, doc="the next layer's transfer overlaps this layer's compute (ZeRO-3 prefetch, "
                                    "two layer buffers); false = fetch, then compute")
    quant_group_size: int = spec(64, doc="weights per quantization group of int4/int8 weights (DeepSpeed "
                                         "ZeRO-Inference default group_size 64)", gt=0)
    quant_group_bytes: float = spec(4.0, doc="bytes stored per quantization group: fp16 scale + fp16 zero point "
                                             "(asymmetric quantization)", ge=0)

    @property
    def weights_offloaded(self) -> bool:
        return "weights" in self.offload

    @property
    def kv_offloaded(self) -> bool:
        return "kv" in self.offload

    def describe_offload(self) -> str:
        if not self.offload:
            return "none (weights and KV cache on the GPU)"
        parts = []
        if self.weights_offloaded:
            parts.append(f"weights in {'NVMe' if self.offload_device == 'nvme' else 'CPU memory'}")
        if self.kv_offloaded:
            parts.append("KV cache in CPU memory")
        return ", ".join(parts)


def parse_offload(value: Any, where: str = "") -> Any:
    """'weights,kv' / 'none' / a list -> a list of targets (the schema checks the names). 'none'
    listed with a target is refused: which of the two is meant is not guessed."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",")]
    if isinstance(value, (list, tuple)):
        items = [v for v in value if v not in ("", "none")]
        if items and "none" in value:
            raise ConfigError(where, f"{SECTION}.offload", list(value),
                              "'none' (everything on the GPU) listed with what to offload: give 'none' alone, or "
                              "only the targets (weights, kv)")
        if all(v in ("weights", "kv") for v in items):
            return [t for t in ("weights", "kv") if t in items]  # one order, no repeats
        return items  # the schema names the bad entry
    return value


def load_generate_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                         mfu_tables: str | None = None, flags: dict[str, Any] | None = None,
                         run_flags: RunFlags | None = None) -> tuple[RunConfig, GenerateSpec]:
    """Read a run YAML with an optional `generate:` section; `flags` (CLI values, None = not given) win
    over `--set generate.*` overrides, which win over the file. `run_flags` are the direct flags of
    the run (infersim.run.flags; path None: the run they name). Returns the core config and the
    resolved spec (batch and lengths filled in)."""
    raw, source, base = read_run_mapping(path, run_flags)
    return config_and_spec(raw, source, overrides, mfu_tables, flags, base=base, run_flags=run_flags)


def config_and_spec(raw: dict[str, Any], source: str, overrides: list[str] | tuple[str, ...] = (),
                    mfu_tables: str | None = None, flags: dict[str, Any] | None = None,
                    base: Path | None = None, run_flags: RunFlags | None = None) -> tuple[RunConfig, GenerateSpec]:
    """As load_generate_config, from an already-read mapping (tests and benchmarks build them inline)."""
    raw = copy.deepcopy(raw)
    section = raw.pop(SECTION, None)
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(source, SECTION, section, "expected a mapping of generate fields")
    core_overrides = []
    for dotted, value, text in parse_overrides(overrides):  # a field given twice is refused here, generate.* too
        if dotted[0] == SECTION:
            if len(dotted) != 2:
                raise ConfigError(source, ".".join(dotted), value, "generate fields are one level deep (generate.batch=64)")
            section[dotted[1]] = value
        else:
            core_overrides.append(text)
    for key, value in (flags or {}).items():
        if value is not None:
            section[key] = value
    where = source + (" with --set overrides" if overrides else "") + (" and command-line flags" if flags else "")
    if "offload" in section:
        section["offload"] = parse_offload(section["offload"], where)
    gen = build(GenerateSpec, section, where, SECTION)
    config = config_from_mapping(raw, source, core_overrides, mfu_tables, base=base, flags=run_flags)
    if config.deployment.weight_offload != "none":
        # generate has its own offload model (whole layers, generate.offload); two would double-count
        raise ConfigError(where, "deployment.weight_offload", config.deployment.weight_offload,
                          "the generate subcommand offloads with generate.offload: weights instead")
    return config, resolve_spec(gen, config, where)


#: generate simulates each decode step; more steps than this is a hang, not a question
MAX_GEN_LEN = 131_072


def resolve_spec(gen: GenerateSpec, config: RunConfig, source: str) -> GenerateSpec:
    """Fill batch and lengths from the workload where not given, and check them."""
    workload, dep = config.workload, config.deployment
    batch = gen.batch
    if batch is None:
        if workload.decode_batch_per_gpu == "max":
            raise ConfigError(source, f"{SECTION}.batch", MISSING,
                              "not given: pass --batch or set generate.batch (workload.decode_batch_per_gpu is 'max', "
                              "which a static batch cannot use)")
        batch = workload.decode_batch_per_gpu * dep.num_gpus
    prompt_len = gen.prompt_len if gen.prompt_len is not None else workload.isl
    gen_len = gen.gen_len if gen.gen_len is not None else workload.osl
    if batch < 1:
        raise ConfigError(source, f"{SECTION}.batch", batch, "must be at least 1 sequence")
    if prompt_len < 1:
        raise ConfigError(source, f"{SECTION}.prompt_len", prompt_len,
                          "must be at least 1 token: prefill needs a prompt to produce the first token")
    if gen_len < 1:
        raise ConfigError(source, f"{SECTION}.gen_len", gen_len,
                          "must be at least 1 token: the first generated token comes from prefill, "
                          "gen_len - 1 decode steps follow")
    if gen_len > MAX_GEN_LEN:
        raise ConfigError(source, f"{SECTION}.gen_len", gen_len,
                          f"at most {MAX_GEN_LEN:,} tokens: every decode step is simulated one by one")
    if dep.pp != 1:
        raise ConfigError(source, "deployment.pp", dep.pp,
                          "generate runs one static batch through all layers; pipeline parallelism is not modelled here")
    _check_batch_split(batch, dep, source)
    if gen.weights_offloaded and gen.offload_device == "nvme" and config.hardware.nvme_bandwidth <= 0:
        raise ConfigError(source, f"{SECTION}.offload_device", "nvme",
                          f"hardware card {config.hardware.name} has no NVMe (nvme_bandwidth is 0)")
    if gen.offload and config.hardware.host_memory_bytes <= 0 and (gen.kv_offloaded or gen.offload_device == "cpu"):
        raise ConfigError(source, f"{SECTION}.offload", list(gen.offload),
                          f"hardware card {config.hardware.name} gives no host memory (host_memory_bytes is 0)")
    return replace(gen, batch=batch, prompt_len=prompt_len, gen_len=gen_len)


def _check_batch_split(batch: int, dep: Deployment, source: str) -> None:
    """The batch splits evenly over the attention-DP replicas, each of which runs its own share (an
    attention-TP group runs any number of sequences: its GPUs split heads, not sequences)."""
    replicas = attention_dp(dep)
    if batch % replicas:
        raise ConfigError(source, f"{SECTION}.batch", batch,
                          f"does not split over the {replicas} attention-DP replicas (deployment.attention.dp): each "
                          f"replica runs its own equal share; give a multiple of {replicas}")
