"""Which bundled kernel tables serve a deployment: chosen by device and serving engine.

Bundled table directories (under `infersim.cards.registry.bundled_dir("mfu_tables")`):

    imported/<device>/                              the original InferSim's H20/H800 tables, measured with
                                                    SGLang-class kernels (DeepGEMM, FlashInfer/FA3): framework sglang
    aiconfigurator/<device>/<framework>-<version>/  NVIDIA aiconfigurator's, per engine and version
    measured/<device>/torch-<version>/              measured by `infersim mfu bench` with PyTorch's own kernels
                                                    (cuBLAS via F.linear, torch SDPA, eager ATen elementwise kernels,
                                                    the host cost of an eager launch): framework torch

`<device>` is the hardware card's name (h100-sxm, h200, b200, gb200, h20, h800, ...). A TensorRT-LLM
deployment is timed with TensorRT-LLM kernels where they are bundled: the directory of the card's
device and the engine's framework (newest version first). Without one, any framework's tables of
the same device are taken, in the order trtllm, sglang, vllm, and the returned note says which and
why. Without a framework (no engine card), the same order applies. No table of the device: None.

Engines that run PyTorch's own kernels (TORCH_KERNEL_FRAMEWORKS: HF transformers) take the measured
torch tables of their device (newest torch first); where none are bundled the fallback's note says
so, naming the directory that would hold them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from infersim.cards.registry import bundled_dir
from infersim.tables.provenance import PROVENANCE_FILE

#: frameworks in the order a fallback prefers them
FRAMEWORK_ORDER: tuple[str, ...] = ("trtllm", "sglang", "vllm")
#: the framework whose kernels the original InferSim's imported tables were measured with
IMPORTED_FRAMEWORK = "sglang"
#: the framework name of tables measured by `infersim mfu bench` (PyTorch's own kernels)
MEASURED_FRAMEWORK = "torch"
#: engine frameworks whose model code runs PyTorch's own kernels (nn.Linear, SDPA, eager elementwise ops)
TORCH_KERNEL_FRAMEWORKS: frozenset[str] = frozenset({"huggingface"})


@dataclass(frozen=True)
class TableChoice:
    """The bundled table directory chosen, and one line saying why."""

    path: Path
    framework: str
    version: str  # engine version, or "unknown" (imported tables)
    note: str


def version_key(text: str) -> tuple:
    """Sortable engine version: numbers as numbers; a pre-release (1.3.0rc20, 0.1.dev5) sorts below
    its release (1.3.0), a post-release (0.5.6.post2) above it."""
    parts: list[tuple] = []
    for piece in re.findall(r"\d+|[a-zA-Z]+", text):
        if piece.isdigit():
            parts.append((1, int(piece)))
        else:
            parts.append((2 if piece.lower() == "post" else 0, piece.lower()))
    return tuple(parts) + ((0.5, ""),)  # the end of a version: above a pre-release tag, below any number


def bundled_candidates(hardware_name: str, root: Path | None = None) -> list[TableChoice]:
    """Every bundled table directory for this device, with its framework and version."""
    root = Path(root) if root is not None else bundled_dir("mfu_tables")
    found: list[TableChoice] = []
    imported = root / "imported" / hardware_name
    if (imported / PROVENANCE_FILE).is_file():
        found.append(TableChoice(imported, IMPORTED_FRAMEWORK, "unknown", ""))
    aic = root / "aiconfigurator" / hardware_name
    if aic.is_dir():
        for directory in sorted(aic.iterdir()):
            framework, _, version = directory.name.partition("-")
            if (directory / PROVENANCE_FILE).is_file() and framework and version:
                found.append(TableChoice(directory, framework, version, ""))
    measured = root / "measured" / hardware_name
    if measured.is_dir():
        for directory in sorted(measured.iterdir()):
            framework, _, version = directory.name.partition("-")
            if (directory / PROVENANCE_FILE).is_file() and framework == MEASURED_FRAMEWORK and version:
                found.append(TableChoice(directory, framework, version, ""))
    return found


def _newest_first(choices: list[TableChoice]) -> list[TableChoice]:
    versioned = sorted((c for c in choices if c.version != "unknown"), key=lambda c: version_key(c.version),
                       reverse=True)
    return versioned + [c for c in choices if c.version == "unknown"]


def _label(choice: TableChoice) -> str:
    version = f" {choice.version}" if choice.version != "unknown" else ""
    if choice.framework == MEASURED_FRAMEWORK:
        return f"PyTorch {choice.version} kernels (measured/{choice.path.parent.name}/{choice.path.name})"
    return f"{choice.framework}{version} ({choice.path.parent.name}/{choice.path.name})" \
        if choice.version != "unknown" else f"{choice.framework}-class kernels (imported/{choice.path.name})"


def bundled_tables_for(hardware_name: str, framework: str | None, root: Path | None = None) -> TableChoice | None:
    """The bundled tables for a hardware card and an engine framework (trtllm, sglang, vllm, huggingface or None);
    None when no bundled table covers the device. `root` overrides the bundled mfu_tables directory."""
    candidates = bundled_candidates(hardware_name, root)
    if framework in TORCH_KERNEL_FRAMEWORKS:
        same = _newest_first([c for c in candidates if c.framework == MEASURED_FRAMEWORK])
        if same:
            chosen = same[0]
            others = f"; other versions bundled: {', '.join(c.version for c in same[1:])}" if len(same) > 1 else ""
            return TableChoice(chosen.path, chosen.framework, chosen.version,
                               f"kernel tables for {hardware_name} and engine {framework}: measured with PyTorch "
                               f"{chosen.version}'s own kernels, as {framework} runs them "
                               f"(measured/{hardware_name}/{chosen.path.name}){others}")
        candidates = [c for c in candidates if c.framework != MEASURED_FRAMEWORK]
    if not candidates:
        return None
    if framework is not None and framework not in TORCH_KERNEL_FRAMEWORKS:
        same = _newest_first([c for c in candidates if c.framework == framework])
        if same:
            chosen = same[0]
            others = f"; other versions bundled: {', '.join(c.version for c in same[1:])}" if len(same) > 1 else ""
            return TableChoice(chosen.path, chosen.framework, chosen.version,
                               f"kernel tables for {hardware_name} and engine {framework}: {_label(chosen)}{others}")
    ordered: list[TableChoice] = []
    for name in FRAMEWORK_ORDER + tuple(sorted({c.framework for c in candidates} - set(FRAMEWORK_ORDER))):
        ordered += _newest_first([c for c in candidates if c.framework == name])
    chosen = ordered[0]
    if framework is None:
        why = f"no engine given; took {_label(chosen)}"
    elif framework in TORCH_KERNEL_FRAMEWORKS:
        why = (f"no tables measured with PyTorch's own kernels are bundled for {hardware_name} "
               f"(mfu_tables/measured/{hardware_name}/torch-<version>/, written by `infersim mfu bench` on that GPU); "
               f"took {_label(chosen)} instead: kernel times are another engine's kernels, not the cuBLAS, SDPA and "
               f"eager elementwise kernels {framework} runs")
    else:
        why = (f"no {framework} tables bundled for {hardware_name}; took {_label(chosen)} instead: kernel times "
               f"are those of another engine's kernels")
    return TableChoice(chosen.path, chosen.framework, chosen.version, f"kernel tables for {hardware_name}: {why}")
