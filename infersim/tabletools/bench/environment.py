"""What `mfu bench` runs on, as its provenance records it: the device and software versions, the
GPU clocks and power limit (nvidia-smi), the cuBLAS this process loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from infersim.tables.format import DeviceInfo


@dataclass(frozen=True)
class Environment:
    """What the kernels run on: the device and the software versions (plain strings)."""

    device: DeviceInfo
    software: dict[str, str]



def nvidia_smi(query: str) -> list[str]:
    """One line of `nvidia-smi --query-gpu=QUERY` for the first GPU, split; [] without nvidia-smi."""
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    first = done.stdout.strip().splitlines()[:1]
    return [v.strip() for v in first[0].split(",")] if first else []


def module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:  # noqa: BLE001 - an optional library that fails to import is simply absent
        return None
    return str(getattr(module, "__version__", "unknown"))


def loaded_cublas_version() -> str:
    """The cuBLAS this process loaded (cublasGetProperty on the library in /proc/self/maps), or 'unknown'."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps
                         if "libcublas.so" in line and "libcublasLt" not in line), None)
        if path is None:
            return "unknown"
        library = ctypes.CDLL(path)
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if library.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                return "unknown"
            parts.append(str(value.value))
        return ".".join(parts)
    except Exception:  # noqa: BLE001 - a version we cannot read is recorded as unknown
        return "unknown"


CLOCK_QUERY = "clocks.max.sm,clocks.max.memory,clocks.sm,clocks.mem,power.limit,driver_version"
CLOCK_NAMES = ("sm_max_mhz", "memory_max_mhz", "sm_mhz", "memory_mhz", "power_limit_w")


def read_clocks(suffix: str = "") -> tuple[dict[str, float], str]:
    """GPU clocks (MHz) and power limit (W) from nvidia-smi, names suffixed (e.g. '_at_end'); and the driver."""
    values = nvidia_smi(CLOCK_QUERY)
    clocks: dict[str, float] = {}
    for name, value in zip(CLOCK_NAMES, values[:5]):
        try:
            clocks[name + suffix] = float(value)
        except ValueError:
            pass
    return clocks, (values[5] if len(values) > 5 else "unknown")
