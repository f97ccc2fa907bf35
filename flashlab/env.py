"""What this machine can run: versions, devices and the book's execution tier.

The book runs at the highest of four tiers the machine offers:

1. NumPy reference            — everywhere
2. Triton under the interpreter (TRITON_INTERPRET=1) — CPU, small sizes
3. Triton on a CUDA GPU       — correctness and timing
4. Hopper-only switches (TMA loads, warp specialisation, FP8) — compute
   capability 9.0 exactly (H100, H200). Newer GPUs are not assumed to behave like Hopper
   (Blackwell replaces warpgroup MMA with tcgen05): they run tier 3.

Nothing here assumes a GPU: every probe fails soft and reports what it found.
"""

from __future__ import annotations

import importlib
import os
import platform
from dataclasses import dataclass, field

__all__ = ["Environment", "report", "TIERS"]

TIERS = {
    1: "NumPy reference (float64, any machine)",
    2: "Triton interpreter on the CPU (small sizes)",
    3: "Triton on a CUDA GPU",
    4: "Hopper-only switches (sm_90: TMA loads, warp specialisation, FP8)",
}


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:
        return None


@dataclass
class Environment:
    """A snapshot of the machine. ``tier`` is the highest execution tier available."""

    python: str
    platform: str
    cpu_count: int
    versions: dict[str, str | None]
    gpus: list[str] = field(default_factory=list)
    compute_capability: tuple[int, int] | None = None
    triton_interpret: bool = False

    @property
    def tier(self) -> int:
        if self.gpus and self.versions.get("triton"):
            return 4 if self.compute_capability == (9, 0) else 3
        if self.versions.get("triton") and self.versions.get("torch"):
            return 2
        return 1

    def __str__(self) -> str:
        lines = [
            f"python        {self.python} on {self.platform}, {self.cpu_count} CPU cores",
            *(f"{name:<13} {ver or 'not installed'}" for name, ver in self.versions.items()),
            f"GPU           {', '.join(self.gpus) if self.gpus else 'none'}"
            + (f" (sm_{self.compute_capability[0]}{self.compute_capability[1]})" if self.compute_capability else ""),
            f"tier          {self.tier}: {TIERS[self.tier]}",
        ]
        return "\n".join(lines)


def report() -> Environment:
    """Probe the machine and return an :class:`Environment` (print it for a summary)."""
    versions = {name: _version(name) for name in ("numpy", "matplotlib", "torch", "triton")}
    gpus: list[str] = []
    capability = None
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            capability = torch.cuda.get_device_capability(0)
    except Exception:
        pass
    return Environment(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        cpu_count=os.cpu_count() or 1,
        versions=versions,
        gpus=gpus,
        compute_capability=capability,
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
    )
