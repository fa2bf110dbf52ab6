"""The launch closure of each eager elementwise kernel `mfu bench` times (infersim.shapes.kernels.ELEMENTWISE_OPS),
made as the HF model code that runs it makes its inputs: the op, dtype and layout of its call there.
"""

from __future__ import annotations

from typing import Any, Protocol
from collections.abc import Callable, Sequence

from infersim.tabletools.bench.cases import ElementwiseCase


class TorchBackend(Protocol):
    """What a launch needs of torch_backend.TorchBackend: torch, the device, and its input allocator."""

    torch: Any
    device: Any
    is_cuda: bool
    _held: list[Any]

    def _tensor(self, shape: Sequence[int], dtype: str) -> Any: ...


def elementwise_launch(backend: TorchBackend, case: ElementwiseCase) -> Callable[[], Any] | str:
    """The launch closure of one elementwise kernel over case.elements elements (the HF call it stands for)."""
    for builders in (_UNARY_LAUNCHES, _SHAPED_LAUNCHES, _INDEXED_LAUNCHES):
        if case.op in builders:
            return builders[case.op](backend, case)
    return f"no launch for elementwise op '{case.op}' in this harness"


_Launch = Callable[[], Any]


def _vector(backend: TorchBackend, case: ElementwiseCase) -> Any:
    return backend._tensor((case.elements,), case.dtype)


def _rows(case: ElementwiseCase) -> tuple[int, int]:
    """(rows, row length) of a reduction over case.elements elements in rows of case.row."""
    row = max(1, min(case.row, case.elements))
    return max(1, case.elements // row), row


def _by(case: ElementwiseCase, bf16: int, other: int) -> int:
    """Rows of `bf16` (hidden-state vectors) or `other` elements, as the op's HF call has them per dtype."""
    return max(1, case.elements // (bf16 if case.dtype == "bf16" else other))


def _held(backend: TorchBackend, tensor: Any) -> Any:
    backend._held.append(tensor)
    return tensor


def _unary(method: Callable[[Any, Any], Any]) -> Callable[[TorchBackend, ElementwiseCase], _Launch]:
    """An op on one vector of case.elements elements: `method(torch, x)`."""
    def build(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
        torch, x = backend.torch, _vector(backend, case)
        return lambda: method(torch, x)
    return build


def _add_scalar(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # variance + eps (fp32); perm // top_k, ids >= experts, clamp_ (int64)
    x = _vector(backend, case)
    return (lambda: x + 1e-6) if case.dtype in ("fp32", "bf16") else (lambda: x // 8)


def _rsqrt(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    torch, x = backend.torch, _vector(backend, case).abs_()
    return lambda: torch.rsqrt(x)


def _binary(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    a, b = _vector(backend, case), _vector(backend, case)
    return (lambda: a * b) if case.op == "mul" else (lambda: a + b)


def _histc(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # HF: int expert ids on CUDA, float on CPU (CPU histc has no integer kernel)
    torch, x = backend.torch, _vector(backend, case)
    if not backend.is_cuda:
        x = x.float()
    return lambda: torch.histc(x, bins=128, min=0, max=127)


_UNARY_LAUNCHES: dict[str, Callable[[TorchBackend, ElementwiseCase], _Launch]] = {
    "to_fp32": _unary(lambda torch, x: x.to(torch.float32)),
    "to_bf16": _unary(lambda torch, x: x.to(torch.bfloat16)),
    "pow": _unary(lambda torch, x: x.pow(2)),
    "neg": _unary(lambda torch, x: -x),
    "silu": _unary(lambda torch, x: torch.nn.functional.silu(x)),
    "sigmoid": _unary(lambda torch, x: torch.sigmoid(x)),
    "sort": _unary(lambda torch, x: torch.sort(x)),
    "cumsum": _unary(lambda torch, x: torch.cumsum(x, 0)),
    "fill": _unary(lambda torch, x: x.zero_()),
    "add_scalar": _add_scalar, "rsqrt": _rsqrt, "mul": _binary, "add": _binary, "histc": _histc,
}


def _mean(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    x = backend._tensor(_rows(case), case.dtype)
    return lambda: x.mean(-1, keepdim=True)


def _mul_broadcast(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # RMSNorm's x * rsqrt(var) (fp32), weight * x and q * cos (bf16)
    rows, row = _rows(case)
    x = backend._tensor((rows, row), case.dtype)
    scale = backend._tensor((rows, 1), case.dtype) if case.dtype == "fp32" else backend._tensor((row,), case.dtype)
    return lambda: x * scale


def _cat(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # DynamicCache decode: the cache (.., S, d) and one new token (.., 1, d) along dim -2
    torch, d = backend.torch, 128
    total = max(2, case.elements // d)
    cache, new = backend._tensor((1, total - 1, d), case.dtype), backend._tensor((1, 1, d), case.dtype)
    return lambda: torch.cat([cache, new], dim=-2)


def _copy(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # a transposed view made contiguous
    side = max(1, int(case.elements ** 0.5))
    x = backend._tensor((side, max(1, case.elements // side)), case.dtype).t()
    return lambda: x.contiguous()


def _router(top_k: bool) -> Callable[[TorchBackend, ElementwiseCase], _Launch]:
    """The router's softmax over 128 experts, or its top-8."""
    def build(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
        torch, x = backend.torch, backend._tensor((max(1, case.elements // 128), 128), case.dtype)
        return (lambda: torch.topk(x, 8, dim=-1)) if top_k else (lambda: torch.softmax(x, dim=-1))
    return build


_SHAPED_LAUNCHES: dict[str, Callable[[TorchBackend, ElementwiseCase], _Launch]] = {
    "mean": _mean, "mul_broadcast": _mul_broadcast, "cat": _cat, "copy": _copy, "softmax": _router(False),
    "topk": _router(True),
}


def _gather(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # hidden_states[perm // top_k]; routing weights by perm (a vector)
    x = backend._tensor((_by(case, 512, 1), 512 if case.dtype == "bf16" else 1), case.dtype)
    index = _held(backend, backend.torch.randperm(x.shape[0], device=backend.device))
    return lambda: x[index]


def _scatter(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # index_add_ of expert outputs; inv_perm[perm] = arange (int64 vectors)
    shape = (_by(case, 512, 1), 512 if case.dtype == "bf16" else 1)
    out, src = backend._tensor(shape, case.dtype), backend._tensor(shape, case.dtype)
    index = _held(backend, backend.torch.randperm(out.shape[0], device=backend.device))
    return lambda: out.index_add_(0, index, src)


def _masked_fill(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    torch = backend.torch
    x = backend._tensor((_by(case, 512, 128), 512 if case.dtype == "bf16" else 128), case.dtype)
    mask = _held(backend, torch.zeros(x.shape[0], 1, device=backend.device, dtype=torch.bool))
    return lambda: x.masked_fill(mask, 0.0)


def _sum(backend: TorchBackend, case: ElementwiseCase) -> _Launch:
    # the top-k partial outputs summed: (tokens, k, d).sum(1); router weights (tokens, k).sum(-1)
    d = 512 if case.dtype == "bf16" else 1
    x = backend._tensor((max(1, case.elements // (8 * d)), 8, d), case.dtype)
    return lambda: x.sum(dim=1)


_INDEXED_LAUNCHES: dict[str, Callable[[TorchBackend, ElementwiseCase], _Launch]] = {
    "gather": _gather, "scatter": _scatter, "masked_fill": _masked_fill, "sum": _sum,
}
