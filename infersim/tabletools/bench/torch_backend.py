"""The kernels `mfu bench` times, launched through PyTorch as HuggingFace transformers launches them,
and the host probes. torch (and transformers, for one host probe) are imported lazily: neither is a
dependency of the simulator.

Kernels and the library that runs each (recorded per table in the provenance):
  gemm           F.linear(x, W) in bf16 (cuBLAS / cuBLASLt, as nn.Linear), torch._scaled_mm in fp8 e4m3
                 with per-tensor fp32 scales (cuBLASLt)
  grouped_gemm   torch.nn.functional.grouped_mm (torch >= 2.10) or torch._grouped_mm over all local experts
                 with row offsets, bf16, as transformers' grouped_mm experts implementation calls it; a
                 torch without either is reported and the family skipped (no substitute is timed)
  attention      F.scaled_dot_product_attention with HF's layouts and arguments; the backend is the one
                 PyTorch's dispatcher picks for those inputs (torch._fused_sdp_choice), which is then
                 pinned with torch.nn.attention.sdpa_kernel while timing, so the table names it
  elementwise    the ATen kernels of infersim.shapes.kernels.ELEMENTWISE_OPS
  host           CPU-side costs: see cases.HOST_PROBES
How a launch is timed: infersim.tabletools.bench.timers; the device and versions recorded:
infersim.tabletools.bench.environment.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from infersim.base.errors import InferSimError
from infersim.tabletools.bench.cases import (
    AttentionCase,
    ElementwiseCase,
    GemmCase,
    GroupedGemmCase,
    HostCase,
    TimedCase,
    input_bytes,
)
from infersim.tabletools.bench.environment import Environment, loaded_cublas_version, module_version, read_clocks
from infersim.tables.format import DeviceInfo


class NoGpuError(InferSimError):
    """The harness needs a CUDA GPU and PyTorch (or `--device cpu` for a smoke run); this machine lacks one."""


@dataclass(frozen=True)
class Prepared:
    """A case ready to time: the launch closure and the library that runs it."""

    launch: Callable[[], Any]
    library: str
    library_version: str = ""


@dataclass
class HostResult:
    """Seconds per call of each probe a host case measured, and notes on how."""

    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# The backend


SDPA_BACKENDS = {"FLASH_ATTENTION": "FlashAttention-2 (torch built-in)", "CUDNN_ATTENTION": "cuDNN attention",
                 "EFFICIENT_ATTENTION": "memory-efficient attention (xFormers/CUTLASS, torch built-in)",
                 "MATH": "math (unfused matmul + softmax)"}


class TorchBackend:
    """Launches every case's kernel through PyTorch on one device (see the module docstring)."""

    def __init__(self, torch: Any, device: str = "cuda") -> None:
        self.torch = torch
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self._held: list[Any] = []
        self._contexts: list[Any] = []
        if self.is_cuda:
            major, minor = torch.cuda.get_device_capability(self.device)
            self.capability = (major, minor)
        else:
            self.capability = (0, 0)
        self.fp8 = self.capability >= (8, 9) and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")

    @classmethod
    def create(cls, device: str = "cuda") -> TorchBackend:
        try:
            import torch
        except ImportError:
            raise NoGpuError("mfu bench needs PyTorch, which is not installed here; run it on the GPU machine whose "
                             "kernels you want to measure (or with --device cpu to check the harness)") from None
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise NoGpuError(f"mfu bench needs a CUDA GPU, and PyTorch {torch.__version__} sees none on this "
                             f"machine; run it on the GPU machine whose kernels you want to measure (--device cpu "
                             f"checks the harness without measuring anything)")
        return cls(torch, device)

    # -- environment

    def environment(self) -> Environment:
        torch = self.torch
        software: dict[str, str] = {"python": sys.version.split()[0], "torch": str(torch.__version__)}
        for name in ("transformers", "triton"):
            version = module_version(name)
            if version:
                software[name] = version
        if not self.is_cuda:
            software["device_note"] = "CPU smoke run: the times are CPU kernels', not any GPU's"
            return Environment(DeviceInfo(name="CPU (smoke run, no GPU)"), software)
        # one GEMM first, so that cuBLAS is loaded and its version can be read
        a = torch.ones(16, 16, device=self.device, dtype=torch.bfloat16)
        torch.nn.functional.linear(a, a)
        torch.cuda.synchronize(self.device)
        props = torch.cuda.get_device_properties(self.device)
        clocks, driver = read_clocks()
        software.update({
            "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version()),
            "cublas": loaded_cublas_version(), "driver": driver,
            "capability": ".".join(map(str, self.capability)),
        })
        device = DeviceInfo(name=str(props.name), sm_count=int(props.multi_processor_count), clocks=clocks,
                            memory_bytes=float(props.total_memory),
                            l2_bytes=float(getattr(props, "L2_cache_size", 0)) or None)
        return Environment(device, software)

    def clocks_at_end(self) -> dict[str, float]:
        """The GPU's clocks and power limit now (nvidia-smi), named ..._at_end; {} on the CPU."""
        return read_clocks("_at_end")[0] if self.is_cuda else {}

    def l2_bytes(self) -> int:
        if not self.is_cuda:
            return 0
        props = self.torch.cuda.get_device_properties(self.device)
        return int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)

    # -- inputs

    def _tensor(self, shape: Sequence[int], dtype: str) -> Any:
        torch = self.torch
        if dtype in ("int64", "int32"):
            x = torch.randint(0, 128, tuple(shape), device=self.device,
                              dtype=torch.int64 if dtype == "int64" else torch.int32)
        else:
            x = torch.randn(*shape, device=self.device, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
            if dtype == "fp8":
                x = x.to(torch.float8_e4m3fn)
        self._held.append(x)
        return x

    def release(self) -> None:
        self._held.clear()
        while self._contexts:
            self._contexts.pop().__exit__(None, None, None)

    def _fits(self, nbytes: float) -> bool:
        if not self.is_cuda:
            return True
        free, _total = self.torch.cuda.mem_get_info(self.device)
        return nbytes < 0.8 * free

    def prepare(self, case: TimedCase) -> Prepared | str:
        """Inputs allocated and one trial launch done: a Prepared, or why the case cannot run here."""
        torch = self.torch
        if getattr(case, "dtype", "") == "fp8" and not self.fp8:
            return "fp8 GEMMs need compute capability 8.9+ and torch._scaled_mm"
        if not self._fits(input_bytes(case) * 1.2):
            return "out of device memory"
        oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", MemoryError)
        try:
            if isinstance(case, GemmCase):
                prepared = self._prepare_gemm(case)
            elif isinstance(case, GroupedGemmCase):
                prepared = self._prepare_grouped(case)
            elif isinstance(case, AttentionCase):
                prepared = self._prepare_attention(case)
            else:
                prepared = self._prepare_elementwise(case)
            if isinstance(prepared, str):
                self.release()
                return prepared
            prepared.launch()  # a trial launch: a kernel that refuses these shapes is a skip, not a crash
            if self.is_cuda:
                torch.cuda.synchronize(self.device)
            return prepared
        except oom:
            self.release()
            if self.is_cuda:
                torch.cuda.empty_cache()
            return "out of device memory"
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
            self.release()
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            return f"the kernel refused these shapes: {first_line}"

    def _prepare_gemm(self, case: GemmCase) -> Prepared | str:
        torch = self.torch
        a = self._tensor((case.m, case.k), case.dtype)
        w = self._tensor((case.n, case.k), case.dtype)  # nn.Linear's weight: N x K, used transposed
        version = f"torch {torch.__version__}, CUDA {torch.version.cuda}" if self.is_cuda else ""
        if case.dtype == "bf16":
            linear = torch.nn.functional.linear
            library = "F.linear (cuBLAS/cuBLASLt, as nn.Linear) bf16" if self.is_cuda else \
                "F.linear (as nn.Linear) bf16 on the CPU"
            return Prepared(lambda: linear(a, w), library, version)
        if case.m % 16 or case.k % 16 or case.n % 16:
            return "torch._scaled_mm needs M, K and N multiples of 16"
        one = torch.ones((), device=self.device, dtype=torch.float32)
        wt = w.t()
        self._held.append(one)
        return Prepared(lambda: torch._scaled_mm(a, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                        "torch._scaled_mm (cuBLASLt) fp8 e4m3 x e4m3, per-tensor fp32 scales, bf16 out", version)

    def _prepare_grouped(self, case: GroupedGemmCase) -> Prepared | str:
        torch = self.torch
        functional = getattr(torch.nn.functional, "grouped_mm", None)
        private = getattr(torch, "_grouped_mm", None)
        if functional is None and private is None:
            return (f"torch {torch.__version__} has no grouped GEMM (torch.nn.functional.grouped_mm, "
                    f"torch._grouped_mm): not measured, and no per-expert loop is timed in its place")
        rows = case.rows_per_expert()
        shape = case.shape
        a = self._tensor((sum(rows), shape.k), "bf16")
        w = self._tensor((case.local_experts, shape.n, shape.k), "bf16")  # per expert N x K, as HF stores them
        wt = w.transpose(-2, -1)
        offsets = torch.tensor([sum(rows[: i + 1]) for i in range(len(rows))], device=self.device, dtype=torch.int32)
        self._held.append(offsets)
        if functional is not None:
            return Prepared(lambda: functional(a, wt, offs=offsets), "torch.nn.functional.grouped_mm bf16",
                            f"torch {torch.__version__}")
        return Prepared(lambda: private(a, wt, offs=offsets), "torch._grouped_mm bf16", f"torch {torch.__version__}")

    def sdpa_backend(self, q: Any, k: Any, v: Any, causal: bool, gqa: bool) -> tuple[Any, str]:
        """The SDPA backend PyTorch's dispatcher picks for these inputs, and how that was found out."""
        torch = self.torch
        backends = torch.nn.attention.SDPBackend
        chooser = getattr(torch, "_fused_sdp_choice", None)
        if chooser is not None:
            index = int(chooser(q, k, v, None, 0.0, causal, scale=None, enable_gqa=gqa))
            for member in backends.__members__.values():
                if int(member) == index:
                    return member, "torch._fused_sdp_choice"
        return None, "default dispatch (torch._fused_sdp_choice not available)"

    def _prepare_attention(self, case: AttentionCase) -> Prepared | str:
        torch = self.torch
        b, h, hk = case.batch, case.num_heads, case.num_kv_heads
        # HF: q_proj(x).view(b, s, h, d).transpose(1, 2); keys and values as DynamicCache concatenated them
        q = self._tensor((b, case.q_len, h, case.qk_head_dim), "bf16").transpose(1, 2)
        k = self._tensor((b, hk, case.kv_len, case.qk_head_dim), "bf16")
        v = self._tensor((b, hk, case.kv_len, case.v_head_dim), "bf16")
        causal = case.stage == "prefill"  # HF: is_causal only for q_len > 1 without a mask
        gqa = hk != h
        sdpa = torch.nn.functional.scaled_dot_product_attention
        kwargs = {"is_causal": causal, "enable_gqa": gqa} if gqa else {"is_causal": causal}
        backend, how = self.sdpa_backend(q, k, v, causal, gqa)
        version = f"torch {torch.__version__}" + (f", cuDNN {torch.backends.cudnn.version()}" if self.is_cuda else "")
        if backend is None:
            return Prepared(lambda: sdpa(q, k, v, **kwargs), f"torch SDPA, backend not determined ({how})", version)
        name = backend.name if hasattr(backend, "name") else str(backend)
        if name in ("ERROR", "OVERRIDEABLE"):
            return f"torch SDPA picks no usable backend for these inputs ({name})"
        context = torch.nn.attention.sdpa_kernel(backend)  # pinned while timing: the table names the backend that ran
        context.__enter__()
        self._contexts.append(context)
        label = SDPA_BACKENDS.get(name, name) if self.is_cuda else "its CPU implementation"
        return Prepared(lambda: sdpa(q, k, v, **kwargs),
                        f"torch SDPA {name} backend: {label} (picked by {how}, pinned with sdpa_kernel)", version)

    def _prepare_elementwise(self, case: ElementwiseCase) -> Prepared | str:
        from infersim.tabletools.bench.launches import elementwise_launch

        launch = elementwise_launch(self, case)
        if isinstance(launch, str):
            return launch
        return Prepared(launch, "eager PyTorch ATen kernels" + ("" if self.is_cuda else " on the CPU"),
                        f"torch {self.torch.__version__}")

    # -- host probes

    def host_probe(self, case: HostCase) -> HostResult | str:
        if case.probe == "hf_decode_step":
            return hf_decode_probe(self)
        return small_op_probe(self, case.probe)


def _per_call(loop: Callable[[int], None], calls: int, sync: Callable[[], None], repeats: int = 5) -> float:
    """Median over `repeats` of the host wall time per call of `loop(calls)`, seconds: the GPU is idle
    when each sample starts, and the loop itself never waits for it (the drain afterwards is not timed)."""
    samples = []
    for _ in range(repeats):
        sync()
        began = time.perf_counter()
        loop(calls)
        samples.append((time.perf_counter() - began) / calls)
    sync()
    return statistics.median(samples)


def small_op_probe(backend: TorchBackend, probe: str, calls: int = 2000) -> HostResult | str:
    """Host wall time per call of a small op, in a loop that never waits for the GPU."""
    torch = backend.torch
    sync = (lambda: torch.cuda.synchronize(backend.device)) if backend.is_cuda else (lambda: None)
    build = _PROBE_LOOPS.get(probe)
    if build is None:
        return f"unknown host probe '{probe}'"
    loop = build(backend, sync)
    loop(50)  # warm-up: first-call dispatch caches, cuBLAS handles
    return HostResult({probe: _per_call(loop, 200 if probe == "sync" else calls, sync)})


# Each probe's loop repeats its op inline (no call around it: the loop's own cost is the probe's)

def _launch_loop(backend: TorchBackend, sync: Callable[[], None]) -> Callable[[int], None]:
    torch = backend.torch
    x, y = torch.ones(1, device=backend.device), torch.ones(1, device=backend.device)

    def loop(n: int) -> None:
        for _ in range(n):
            torch.add(x, y)
    return loop


def _linear_loop(backend: TorchBackend, sync: Callable[[], None]) -> Callable[[int], None]:
    torch = backend.torch
    a = torch.ones(1, 64, device=backend.device, dtype=torch.bfloat16)
    w = torch.ones(64, 64, device=backend.device, dtype=torch.bfloat16)
    linear = torch.nn.functional.linear

    def loop(n: int) -> None:
        for _ in range(n):
            linear(a, w)
    return loop


def _view_loop(backend: TorchBackend, sync: Callable[[], None]) -> Callable[[int], None]:
    x = backend.torch.ones(1, device=backend.device)

    def loop(n: int) -> None:
        for _ in range(n):
            x.view(-1)
    return loop


def _module_loop(backend: TorchBackend, sync: Callable[[], None]) -> Callable[[int], None]:
    torch = backend.torch
    x = torch.ones(1, device=backend.device)

    class Passthrough(torch.nn.Module):
        def forward(self, value: Any) -> Any:
            return value

    module = Passthrough()

    def loop(n: int) -> None:
        for _ in range(n):
            module(x)
    return loop


def _sync_loop(backend: TorchBackend, sync: Callable[[], None]) -> Callable[[int], None]:
    def loop(n: int) -> None:
        for _ in range(n):
            sync()
    return loop


_PROBE_LOOPS: dict[str, Callable[[TorchBackend, Callable[[], None]], Callable[[int], None]]] = {
    "launch": _launch_loop, "launch_linear": _linear_loop, "view": _view_loop, "module_call": _module_loop,
    "sync": _sync_loop,
}


HF_PROBE_CONFIG = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=4096)


def hf_decode_probe(backend: TorchBackend, layers: tuple[int, int] = (2, 10), steps: int = 40) -> HostResult | str:
    """Host cost of HF transformers' eager decode on this machine, from a Llama of tiny width (so the GPU
    finishes each kernel before the CPU launches the next: the wall time is the CPU's):
      hf_kernel        host seconds per kernel launched inside decoder layers: the difference in decode-forward
                       wall time between two layer counts over the difference in CUDA kernels the profiler counts
      hf_forward_step  host seconds per decode forward outside the layers (embedding, rotary tables, mask, norm,
                       LM head) at the smaller layer count, beyond its kernels at hf_kernel each
      hf_generate_step host seconds per generate() step outside the model's forward (logits processing,
                       stopping criteria, input and mask updates, their host-device syncs)"""
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
    except ImportError:
        return "transformers is not installed: the HF host probe is skipped"
    torch = backend.torch
    sync = (lambda: torch.cuda.synchronize(backend.device)) if backend.is_cuda else (lambda: None)
    results: dict[int, tuple[float, int]] = {}
    generate: dict[int, float] = {}
    for count in layers:
        config = AutoConfig.for_model(**HF_PROBE_CONFIG, num_hidden_layers=count)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        model = model.to(backend.device).eval()
        ids = torch.randint(0, 200, (1, 16), device=backend.device)
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(5):
                model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync()
            began = time.perf_counter()
            for _ in range(steps):
                model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync()
            wall = (time.perf_counter() - began) / steps
            kernels = _kernels_in_one_forward(torch, backend, model, token, cache)
            results[count] = (wall, kernels)
            timings = []
            for new in (8, 8 + steps):
                options = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
                model.generate(ids, **options)  # warm
                sync()
                began = time.perf_counter()
                model.generate(ids, **options)
                sync()
                timings.append(time.perf_counter() - began)
            generate[count] = (timings[1] - timings[0]) / steps
        del model
    (wall_a, kernels_a), (wall_b, kernels_b) = results[layers[0]], results[layers[1]]
    if kernels_b <= kernels_a:
        return f"the profiler counted no more kernels for {layers[1]} layers than for {layers[0]}: probe not usable"
    per_kernel = (wall_b - wall_a) / (kernels_b - kernels_a)
    if per_kernel <= 0:
        return (f"the HF probe's decode forward took no longer with {layers[1]} layers ({wall_b * 1e3:.3f} ms) than "
                f"with {layers[0]} ({wall_a * 1e3:.3f} ms): timing noise, probe not usable")
    outside_layers = wall_a - per_kernel * kernels_a
    per_generate = generate[layers[0]] - wall_a
    notes = [f"HF host probe: transformers {transformers.__version__}, tiny Llama (hidden 64) on {backend.device}; "
             f"decode forward {wall_a * 1e3:.3f} ms with {kernels_a} kernels ({layers[0]} layers), "
             f"{wall_b * 1e3:.3f} ms with {kernels_b} ({layers[1]} layers); generate() step "
             f"{generate[layers[0]] * 1e3:.3f} ms"]
    if not backend.is_cuda:
        notes.append("counted on CPU: kernels are the ATen ops that would launch one (the profiler's CPU ops)")
    return HostResult({"hf_kernel": per_kernel, "hf_forward_step": max(0.0, outside_layers),
                       "hf_generate_step": max(0.0, per_generate), "hf_kernels_per_layer":
                       (kernels_b - kernels_a) / (layers[1] - layers[0])}, notes)


def _kernels_in_one_forward(torch: Any, backend: TorchBackend, model: Any, token: Any, cache: Any) -> int:
    """Kernels one decode forward launches: CUDA kernels the profiler records (on CPU: the leaf ATen ops
    that do work, the same rule as benchmarks/gpu/count_eager_ops.py)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if backend.is_cuda else [])
    with torch.no_grad(), profile(activities=activities) as prof:
        model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if backend.is_cuda:
            torch.cuda.synchronize(backend.device)
    events = prof.events()
    if backend.is_cuda:
        return sum(1 for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")
                   and not e.name.startswith(("Memcpy", "Memset", "cudaMemcpy")))
    return count_cpu_kernel_ops(events)


#: ATen ops that never launch a kernel (views, metadata, allocation, composites whose children do the work)
NO_KERNEL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::reshape", "aten::_reshape_alias",
    "aten::transpose", "aten::t", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::slice", "aten::select",
    "aten::as_strided", "aten::permute", "aten::_unsafe_view", "aten::detach", "aten::detach_", "aten::alias",
    "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::unbind", "aten::narrow", "aten::contiguous", "aten::to", "aten::_to_copy",
    "aten::result_type", "aten::expand_as", "aten::view_as", "aten::matmul", "aten::linear", "aten::dropout",
    "aten::flatten", "aten::resize_", "aten::set_", "aten::scaled_dot_product_attention", "aten::lift_fresh_copy",
})


def count_cpu_kernel_ops(events: Any) -> int:
    """Leaf ATen ops that would each launch one CUDA kernel: not in NO_KERNEL_OPS and without such a
    descendant. CPU-only artefacts (a scalar wrapped into a tensor by a copy_ under add/div) are left out."""
    def does_work(event: Any) -> bool:
        return event.name.startswith("aten::") and event.name not in NO_KERNEL_OPS

    def has_working_descendant(event: Any) -> bool:
        return any(does_work(c) or has_working_descendant(c) for c in event.cpu_children)

    count = 0
    for event in events:
        if not does_work(event) or has_working_descendant(event):
            continue
        parent = event.cpu_parent
        if event.name == "aten::copy_" and parent is not None and parent.name in ("aten::_to_copy", "aten::to") \
                and parent.cpu_parent is not None and parent.cpu_parent.name in ("aten::add", "aten::div_",
                                                                                 "aten::mul", "aten::sub"):
            continue  # a Python scalar wrapped into a CPU tensor: no kernel on CUDA
        count += 1
    return count
