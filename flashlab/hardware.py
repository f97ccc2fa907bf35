"""GPU specifications and the roofline model.

Every number in this module carries a source: a datasheet, a whitepaper, the CUDA
programming guide, or one of the four FlashAttention papers. Numbers that are not
published directly are *derived* from published ones, and the derivation is shown
(for example exp throughput = SMs x MUFU ops per SM per cycle x clock).

Glossary
--------
SM      streaming multiprocessor, the GPU's independent "small factory" (流式多处理器)
SRAM    on-chip memory next to the compute units: one array per SM, split between the
        L1 data cache and shared memory (片上存储)
L2      the cache shared by all SMs, on the chip between the SMs and HBM (二级缓存)
HBM     high-bandwidth memory, the GPU's large off-chip DRAM, which CUDA and Triton
        call global memory (高带宽显存, 全局内存)
MUFU    multi-function unit that evaluates exp2, log2, rcp, sin... (特殊函数单元)
ridge   arithmetic intensity (FLOP per byte) above which a kernel is compute-bound (屋脊点)

All rates are *dense* (no 2:4 sparsity) and in SI units: FLOP/s, bytes/s, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np

KB = 1024
MiB = 1024 * KB  # NVIDIA's "MB" of cache are binary: the A100's 40 MB L2 is listed as 40960 KB
GB = 10**9
TB = 10**12
TERA = 1e12

__all__ = [
    "GPU",
    "A100",
    "H100",
    "H200",
    "B200",
    "B300",
    "GPUS",
    "get",
    "arithmetic_intensity",
    "roofline",
    "memory_hierarchy_table",
]


@dataclass(frozen=True)
class GPU:
    """One GPU model. Per-second rates are for the whole chip, dense.

    Attributes
    ----------
    name, arch, year : identification; ``year`` is when the part shipped.
    sm_count : number of streaming multiprocessors enabled on the product.
    sram_per_sm : bytes of on-chip SRAM per SM: the combined L1 data cache and
        shared memory, one array whose split between the two is configurable.
    smem_max_per_sm : the largest part of ``sram_per_sm`` that can be configured
        as shared memory (the rest stays L1 cache); 0 if not given.
    hbm_capacity, hbm_bandwidth : bytes and bytes/s of off-chip memory.
    tensor_flops : dense tensor-core FLOP/s by input dtype ("fp16", "bf16",
        "fp8"); a dtype the tensor cores cannot take is absent.
    fp32_flops : FLOP/s of ordinary (non-matmul) fp32 arithmetic, counting an
        FMA as 2 FLOPs.
    clock_hz : the clock that turns the per-cycle rates below into per-second
        rates (the one at which the datasheet's tensor FLOP/s are quoted).
    mma_flops_per_cycle : dense 16-bit tensor FLOPs per SM per cycle.
    mufu_exp_per_cycle : exp2 evaluations per SM per cycle (MUFU).
    smem_bytes_per_cycle : shared-memory read bandwidth per SM per cycle.
    tmem_per_sm : bytes of tensor memory per SM (Blackwell only, else 0).
    register_file_per_sm : bytes of registers per SM (64K 32-bit registers on
        every GPU here), the fastest and smallest level; 0 if not given.
    l2_cache : bytes of L2 cache, one cache shared by all SMs, between them and
        HBM; 0 if NVIDIA does not publish it.
    l2_bandwidth : L2 read bandwidth of the whole chip in bytes/s; 0 if NVIDIA
        does not publish it.
    sram_bandwidth : aggregate SRAM (shared-memory read) bandwidth of all SMs
        together, in bytes/s.
    sources : for each attribute name, where its number comes from.
    """

    name: str
    arch: str
    year: int
    sm_count: int
    sram_per_sm: int
    hbm_capacity: int
    hbm_bandwidth: float
    tensor_flops: Mapping[str, float]
    fp32_flops: float
    clock_hz: float
    mma_flops_per_cycle: int
    mufu_exp_per_cycle: int
    smem_bytes_per_cycle: int
    tmem_per_sm: int = 0
    sram_bandwidth: float = 0.0
    register_file_per_sm: int = 0
    smem_max_per_sm: int = 0
    l2_cache: int = 0
    l2_bandwidth: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)

    # ---- derived quantities -------------------------------------------------
    @property
    def sram_total(self) -> int:
        """Bytes of SRAM (L1 + shared memory) on the whole chip (SMs x SRAM per SM)."""
        return self.sm_count * self.sram_per_sm

    @property
    def smem_max_total(self) -> int:
        """Bytes of shared memory on the whole chip at the largest carve-out (SMs x smem_max_per_sm)."""
        return self.sm_count * self.smem_max_per_sm

    @property
    def register_total(self) -> int:
        """Bytes of registers on the whole chip (SMs x register file per SM)."""
        return self.sm_count * self.register_file_per_sm

    @property
    def exp_per_second(self) -> float:
        """exp2 evaluations per second: SMs x MUFU ops per SM per cycle x clock."""
        return self.sm_count * self.mufu_exp_per_cycle * self.clock_hz

    @property
    def mma_flops_from_cycles(self) -> float:
        """16-bit tensor FLOP/s rebuilt from the per-cycle rate (checks the table)."""
        return self.sm_count * self.mma_flops_per_cycle * self.clock_hz

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense tensor-core FLOP/s for ``dtype`` ("fp16", "bf16" or "fp8")."""
        if dtype not in self.tensor_flops:
            raise ValueError(
                f"dtype must be one of {sorted(self.tensor_flops)} for {self.name}; got {dtype!r}"
            )
        return self.tensor_flops[dtype]

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline bends:
        peak FLOP/s / HBM bytes/s. Kernels below it are memory-bound."""
        return self.peak_flops(dtype) / self.hbm_bandwidth

    def attainable_flops(self, intensity: float | np.ndarray, dtype: str = "bf16") -> np.ndarray:
        """Roofline: min(peak, intensity x bandwidth), FLOP/s, elementwise."""
        return roofline(intensity, self.peak_flops(dtype), self.hbm_bandwidth)

    def source(self, attribute: str) -> str:
        """Where the number behind ``attribute`` comes from."""
        if attribute not in self.sources:
            raise KeyError(f"attribute must be one of {sorted(self.sources)}; got {attribute!r}")
        return self.sources[attribute]


_CUDA_GUIDE = (
    "CUDA C++ Programming Guide, 'Arithmetic Instructions' throughput table: "
    "16 results/clock/SM for exp2f and other special functions on compute capability 8.x and 9.0"
)
_REGISTERS = (
    "CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability': "
    "64K 32-bit registers per SM = 256 KB"
)
_FA4_TABLE = "FlashAttention-4 paper (Zadouri et al., 2026), per-SM per-cycle resource table"

A100 = GPU(
    name="A100",
    arch="Ampere (sm_80)",
    year=2020,
    sm_count=108,
    sram_per_sm=192 * KB,
    hbm_capacity=40 * GB,
    hbm_bandwidth=1.555 * TB,
    tensor_flops={"fp16": 312 * TERA, "bf16": 312 * TERA},
    fp32_flops=19.5 * TERA,
    clock_hz=1.41e9,
    mma_flops_per_cycle=2048,
    mufu_exp_per_cycle=16,
    smem_bytes_per_cycle=128,
    sram_bandwidth=19 * TB,
    register_file_per_sm=256 * KB,
    smem_max_per_sm=164 * KB,
    l2_cache=40 * MiB,
    l2_bandwidth=5120 * 1.41e9,
    sources={
        "sm_count": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs",
        "sram_per_sm": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 192 KB of combined L1 data cache "
        "and shared memory per SM; FlashAttention paper (Dao et al., 2022) §2.1: 192 KB of on-chip SRAM per SM",
        "smem_max_per_sm": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020) and CUDA C++ Programming Guide, "
        "compute capability 8.0: shared memory configurable up to 164 KB per SM",
        "hbm_capacity": "NVIDIA A100 datasheet: 40 GB HBM2 (80 GB HBM2e variant); FlashAttention §2.1: 40-80 GB",
        "hbm_bandwidth": "NVIDIA A100 datasheet: 1,555 GB/s (40 GB); FlashAttention §2.1: 1.5-2.0 TB/s",
        "tensor_flops": "NVIDIA A100 datasheet: 312 TFLOPS dense FP16/BF16 tensor; no FP8 tensor cores",
        "fp32_flops": "NVIDIA A100 datasheet: 19.5 TFLOPS FP32; FlashAttention-2 paper §3.1",
        "clock_hz": "A100 whitepaper: 1410 MHz boost (108 x 2048 x 1.41e9 = 312 TFLOPS)",
        "mma_flops_per_cycle": "A100 whitepaper: 1024 dense FP16 FMA/clock/SM = 2048 FLOPs",
        "mufu_exp_per_cycle": _CUDA_GUIDE,
        "smem_bytes_per_cycle": "A100 whitepaper: 128 bytes/clock/SM of shared-memory bandwidth",
        "sram_bandwidth": "FlashAttention paper §2.1: SRAM bandwidth estimated around 19 TB/s",
        "register_file_per_sm": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 256 KB register file per SM; " + _REGISTERS,
        "l2_cache": "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 40 MB L2 cache (40960 KB in its "
        "specification table)",
        "l2_bandwidth": "derived: 5120 bytes/clock (A100 whitepaper: 'The A100 L2 read bandwidth is 5120 Bytes/clk') "
        "x 1.41 GHz = 7.2 TB/s",
    },
)

H100 = GPU(
    name="H100 SXM5",
    arch="Hopper (sm_90)",
    year=2022,
    sm_count=132,
    sram_per_sm=256 * KB,
    hbm_capacity=80 * GB,
    hbm_bandwidth=3.35 * TB,
    tensor_flops={"fp16": 989.4 * TERA, "bf16": 989.4 * TERA, "fp8": 1978.9 * TERA},
    fp32_flops=66.9 * TERA,
    clock_hz=1.83e9,
    mma_flops_per_cycle=4096,
    mufu_exp_per_cycle=16,
    smem_bytes_per_cycle=128,
    sram_bandwidth=132 * 128 * 1.83e9,
    register_file_per_sm=256 * KB,
    smem_max_per_sm=228 * KB,
    l2_cache=50 * MiB,
    sources={
        "sm_count": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs on H100 SXM5",
        "sram_per_sm": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 256 KB of combined L1 data cache "
        "and shared memory per SM",
        "smem_max_per_sm": "H100 whitepaper and CUDA C++ Programming Guide, compute capability 9.0: shared memory "
        "configurable up to 228 KB per SM",
        "hbm_capacity": "NVIDIA H100 datasheet: 80 GB HBM3 (SXM)",
        "hbm_bandwidth": "NVIDIA H100 datasheet: 3.35 TB/s (SXM)",
        "tensor_flops": "NVIDIA H100 datasheet: 989 TFLOPS dense FP16/BF16, 1,979 dense FP8 (half the sparse figures); FlashAttention-3 §1",
        "fp32_flops": "NVIDIA H100 datasheet: 67 TFLOPS FP32 (SXM)",
        "clock_hz": "derived: 989.4 TFLOPS / (132 SMs x 4096 FLOPs/cycle) = 1.83 GHz",
        "mma_flops_per_cycle": _FA4_TABLE + ": 4096 16-bit MMA FLOPs per SM per cycle",
        "mufu_exp_per_cycle": _FA4_TABLE + ": 16 exps per SM per cycle; FlashAttention-3 §3: 3.9 TFLOPS of special functions",
        "smem_bytes_per_cycle": _FA4_TABLE + ": 128 bytes per SM per cycle",
        "sram_bandwidth": "derived: 132 SMs x 128 B/cycle x 1.83 GHz",
        "register_file_per_sm": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 256 KB register file per SM; " + _REGISTERS,
        "l2_cache": "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), 'H100 L2 Cache': 'A 50 MB L2 cache "
        "in H100 is 1.25x larger than A100's 40 MB L2'",
        "l2_bandwidth": "not published: neither the H100 whitepaper nor the datasheet gives an L2 bandwidth (0 = not given)",
    },
)

# The H200 is the H100's GH100 chip with more, faster memory: every per-SM number is the H100's.
H200 = replace(
    H100,
    name="H200 SXM",
    year=2024,
    hbm_capacity=141 * GB,
    hbm_bandwidth=4.8 * TB,
    sources={
        **{key: "same GH100 chip and SM as H100 SXM5 -- " + text for key, text in H100.sources.items()},
        "hbm_capacity": "NVIDIA H200 datasheet: 141 GB HBM3e",
        "hbm_bandwidth": "NVIDIA H200 datasheet: 4.8 TB/s",
        "tensor_flops": "NVIDIA H200 datasheet: 1,979 TFLOPS FP16/BF16 and 3,958 FP8 with sparsity; dense is half",
        "fp32_flops": "NVIDIA H200 datasheet: 67 TFLOPS FP32",
        "l2_cache": "not in NVIDIA's H200 datasheet; the book uses the H100 SXM5's 50 MB, since the H200 is the same "
        "GH100 chip with the same 132 SMs (H100 whitepaper, 'H100 L2 Cache': 50 MB)",
    },
)

B200 = GPU(
    name="B200",
    arch="Blackwell (sm_100)",
    year=2025,
    sm_count=148,
    sram_per_sm=256 * KB,
    hbm_capacity=192 * GB,
    hbm_bandwidth=8.0 * TB,
    tensor_flops={"fp16": 2250 * TERA, "bf16": 2250 * TERA, "fp8": 4500 * TERA},
    fp32_flops=75 * TERA,
    clock_hz=2250 * TERA / (148 * 8192),
    mma_flops_per_cycle=8192,
    mufu_exp_per_cycle=16,
    smem_bytes_per_cycle=128,
    tmem_per_sm=256 * KB,
    sram_bandwidth=148 * 128 * (2250 * TERA / (148 * 8192)),
    register_file_per_sm=256 * KB,
    smem_max_per_sm=228 * KB,
    sources={
        "sm_count": "NVIDIA Blackwell architecture technical brief: 148 SMs enabled on B200",
        "sram_per_sm": "CUDA C++ Programming Guide, compute capability 10.0 (shared memory section): a unified "
        "L1 data cache and shared memory of 256 KB per SM",
        "smem_max_per_sm": "CUDA C++ Programming Guide, compute capability 10.0: shared memory configurable up to "
        "228 KB per SM",
        "hbm_capacity": "NVIDIA HGX B200 datasheet: 192 GB HBM3e per GPU (180 GB usable in DGX B200)",
        "hbm_bandwidth": "NVIDIA HGX B200 datasheet: 8 TB/s per GPU",
        "tensor_flops": "NVIDIA HGX B200 datasheet: 4.5 PFLOPS FP16/BF16 and 9 PFLOPS FP8 sparse per GPU; dense is half. "
        "FlashAttention-4: 1613 TFLOPS = 71% of peak",
        "fp32_flops": "NVIDIA HGX B200 datasheet: 75 TFLOPS FP32 per GPU",
        "clock_hz": "derived: 2250 TFLOPS / (148 SMs x 8192 FLOPs/cycle) = 1.86 GHz",
        "mma_flops_per_cycle": _FA4_TABLE + ": 8192 16-bit MMA FLOPs per SM per cycle",
        "mufu_exp_per_cycle": _FA4_TABLE + ": 16 exps per SM per cycle (unchanged from H100)",
        "smem_bytes_per_cycle": _FA4_TABLE + ": 128 bytes per SM per cycle (unchanged from H100)",
        "tmem_per_sm": _FA4_TABLE + ": 256 KB tensor memory per SM",
        "sram_bandwidth": "derived: 148 SMs x 128 B/cycle x clock",
        "register_file_per_sm": _REGISTERS + " (compute capability 10.0)",
        "l2_cache": "not published in the HGX B200 datasheet or the Blackwell technical brief (0 = not given)",
        "l2_bandwidth": "not published (0 = not given)",
    },
)

# Blackwell Ultra keeps the B200's SM and tensor cores; it has more SMs and memory and
# twice the exponential throughput per SM.
_B300_CLOCK = 2250 * TERA / (160 * 8192)
B300 = replace(
    B200,
    name="B300",
    arch="Blackwell Ultra (sm_103)",
    sm_count=160,
    hbm_capacity=288 * GB,
    clock_hz=_B300_CLOCK,
    mufu_exp_per_cycle=32,
    sram_bandwidth=160 * 128 * _B300_CLOCK,
    sources={
        **{key: "same SM design as B200 -- " + text for key, text in B200.sources.items()},
        "sm_count": "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs",
        "hbm_capacity": "NVIDIA HGX B300 datasheet: 288 GB HBM3e per GPU",
        "hbm_bandwidth": "NVIDIA HGX B300 datasheet: 8 TB/s per GPU",
        "tensor_flops": "NVIDIA HGX B300 datasheet: dense FP16/BF16 2.25 PFLOPS, FP8 4.5 PFLOPS per GPU (as B200)",
        "fp32_flops": "NVIDIA HGX B300 datasheet: 75 TFLOPS FP32 per GPU",
        "clock_hz": "derived: 2250 TFLOPS / (160 SMs x 8192 FLOPs/cycle)",
        "mufu_exp_per_cycle": "FlashAttention-4 paper (Zadouri et al., 2026): B300 doubles MUFU exp to 32 per SM per cycle",
        "tmem_per_sm": "'Inside NVIDIA Blackwell Ultra': 256 KB TMEM per SM (40 MB over 160 SMs)",
        "sram_bandwidth": "derived: 160 SMs x 128 B/cycle x clock",
    },
)

GPUS: dict[str, GPU] = {"A100": A100, "H100": H100, "H200": H200, "B200": B200, "B300": B300}


def get(name: str) -> GPU:
    """Look a GPU up by name ("A100", "H100", "H200", "B200", "B300"; case-insensitive)."""
    key = name.strip().upper()
    if key not in GPUS:
        raise ValueError(f"name must be one of {sorted(GPUS)}; got {name!r}")
    return GPUS[key]


def arithmetic_intensity(flops: float | np.ndarray, bytes_moved: float | np.ndarray) -> np.ndarray:
    """FLOPs performed per byte moved between HBM and the chip."""
    bytes_moved = np.asarray(bytes_moved, dtype=np.float64)
    if np.any(bytes_moved <= 0):
        raise ValueError(f"bytes_moved must be positive; got {bytes_moved!r}")
    return np.asarray(flops, dtype=np.float64) / bytes_moved


def roofline(intensity: float | np.ndarray, peak_flops: float, bandwidth: float) -> np.ndarray:
    """Attainable FLOP/s = min(peak_flops, intensity x bandwidth) (Williams et al., 2009)."""
    intensity = np.asarray(intensity, dtype=np.float64)
    if np.any(intensity < 0):
        raise ValueError(f"intensity must be non-negative; got {intensity!r}")
    return np.minimum(peak_flops, intensity * bandwidth)


def memory_hierarchy_table(gpu: GPU) -> list[dict[str, object]]:
    """Rows (level, capacity in bytes, bandwidth in bytes/s, source) from fastest to largest:
    SRAM, the L2 cache (where its size is published) and HBM.

    The SRAM row counts the whole on-chip L1 + shared-memory array of every SM; a
    kernel can claim at most ``smem_max_per_sm`` of each SM's part as shared memory.
    The L2 row's bandwidth is ``None`` where NVIDIA publishes none. The book's IO model
    (chapters 3 and 4) keeps only two levels, SRAM and HBM: a kernel cannot choose what
    the L2 keeps, so the model counts every byte that crosses between SRAM and HBM."""
    rows = [
        {
            "level": "SRAM (L1 + shared memory, all SMs)",
            "capacity": gpu.sram_total,
            "bandwidth": gpu.sram_bandwidth,
            "source": gpu.sources["sram_per_sm"] + "; " + gpu.sources["sram_bandwidth"],
        },
    ]
    if gpu.l2_cache:
        rows.append({
            "level": "L2 cache (shared by all SMs)",
            "capacity": gpu.l2_cache,
            "bandwidth": gpu.l2_bandwidth or None,
            "source": gpu.sources["l2_cache"] + ("; " + gpu.sources["l2_bandwidth"] if gpu.l2_bandwidth else ""),
        })
    rows.append({
        "level": "HBM (global memory)",
        "capacity": gpu.hbm_capacity,
        "bandwidth": gpu.hbm_bandwidth,
        "source": gpu.sources["hbm_capacity"] + "; " + gpu.sources["hbm_bandwidth"],
    })
    return rows
