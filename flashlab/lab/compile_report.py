"""What the compiler made of a kernel, without a GPU: registers, spills, shared memory, warp
specialisation and the instruction mix of the key loop, for Hopper (sm_90).

    python -m flashlab.lab.compile_report --out results          # writes results/compile_sm90.csv + .json

Triton compiles for a GPU it is not running on when it is given the target: here
``GPUTarget("cuda", 90, 32)``, an H100/H200. This module builds the argument types of
flashlab's bf16 forward (:mod:`flashlab.kernels.forward`), FP8 forward
(:mod:`flashlab.kernels.fp8`, and its lab variant :mod:`flashlab.lab.variants.fp8_schedules`)
and FA4-style forward (:mod:`flashlab.kernels.fa4`) as their launchers would, compiles one
configuration, and reads the result three ways:

* the cubin's resource usage (``cuobjdump -res-usage``, shipped with Triton): registers per
  thread and stack bytes, where spilled registers go;
* the Triton GPU IR: whether a ``ttg.warp_specialize`` region exists, that is, whether
  ``warp_specialize=True`` really split the loop into producer and consumer warps;
* the SASS (``cuobjdump -sass``): the instructions of the longest loop, the key loop, counted by
  opcode, and divided by the scores each thread computes per iteration.

A compile that fails (a compiler pass that gives up) is recorded with its first error line.

Register arithmetic (why the counts matter): an SM has 65536 registers and 228 KB of shared
memory (227 KB for one program); a program of ``warps`` warps with ``regs`` registers per thread
needs ``32 * warps * regs`` of them, so ``65536 // (32 * warps * regs)`` programs fit by registers
(ignoring the allocation granularity), and a cap (``maxnreg``) can raise that number.

The numbers depend on the Triton version (``triton`` in the record's provenance), and
``make test`` installs whatever Triton the project pins.

Glossary: register = 寄存器; spill = 溢出 (to local memory, 本地内存); shared memory = 共享内存;
SASS = the GPU's machine code (机器码); opcode = 操作码; occupancy = 占用率 (programs per SM).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["CASES", "compile_case", "loop_mix", "main", "report"]

TARGET_ARCH = 90  # Hopper: H100, H200
REGISTERS_PER_SM = 65536
SHARED_PER_SM = 228 * 1024
KERNELS = ("forward", "fp8", "fa4", "backward_one_pass")
OPCODES = ("HGMMA", "QGMMA", "MUFU", "FMUL", "FFMA", "FADD", "FMNMX", "F2FP", "SHFL", "LDL", "STL")

# (kernel, (BLOCK_M, BLOCK_N, warps, stages[, maxnreg]), d, options) compiled by main(): the
# configurations chapters 6 and 8 discuss (options: see compile_case).
CASES: list[tuple[str, tuple[int, ...], int, dict]] = [
    ("forward", (128, 128, 8, 3), 128, {"tma": True}),
    ("forward", (128, 128, 8, 3), 128, {"tma": True, "warp_specialize": True}),
    ("forward", (128, 64, 4, 3), 128, {"tma": True}),
    ("forward", (128, 64, 4, 3), 128, {"tma": True, "warp_specialize": True}),
    ("forward", (128, 128, 4, 3), 128, {"tma": True}),
    ("fp8", (128, 64, 4, 3), 128, {}),
    ("fp8", (128, 128, 8, 3), 128, {}),
    ("fp8", (64, 128, 4, 3), 128, {}),
    ("fp8", (64, 128, 4, 2), 128, {}),
    ("fp8", (64, 128, 4, 2, 168), 128, {}),
    ("fp8", (64, 64, 4, 3), 128, {}),
    ("fp8", (64, 128, 4, 3), 128, {"pipeline": "qk"}),
    ("fp8", (128, 128, 8, 3), 128, {"pipeline": "qk"}),
    ("fp8", (64, 128, 4, 3), 128, {"v_block": None}),
    ("fp8", (64, 128, 4, 3), 128, {"v_block": None, "rescale_threshold": 2.0}),
    ("fp8", (64, 128, 4, 3), 128, {"v_block": None, "pipeline": "pv"}),
    ("fp8", (64, 128, 4, 2), 128, {"v_block": None, "pipeline": "pv"}),
]


def _tools() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _signature(fn, pointers: dict[str, str], descriptors: dict[str, str], scalars: dict[str, str],
               constexprs: dict[str, object]) -> tuple[dict, dict, dict]:
    """Types of every argument of ``fn`` as its launcher would pass them: the signature, the
    constexprs (by argument name, or by (argument, element) for tuples) and the 16-byte alignment
    assumed for pointers and strides. A tuple of strides (an argument named ``*_strides``: batch,
    head, row, d) has a unit stride along d, which the launcher specialises as a constant; every
    other stride is a multiple of 16 in the cases compiled here. Unnamed scalars are int32."""
    sig, attrs, consts = {}, {}, {}
    div16 = [["tt.divisibility", 16]]
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            consts[name] = constexprs[name]
        elif name in pointers:
            sig[name] = pointers[name]
            attrs[(i,)] = div16
        elif name in descriptors:
            sig[name] = descriptors[name]
        elif name == "descale_strides":  # three (batch, head, block) tuples, the blocks contiguous
            sig[name] = (("i32", "i32", "constexpr"),) * 3
            consts.update({(i, t, 2): 1 for t in range(3)})
            attrs.update({(i, t, j): div16 for t in range(3) for j in range(2)})
        elif name == "lse_strides":  # (batch, head) of the (B, H, N) log-sum-exp; rows contiguous
            sig[name] = ("i32", "i32")
            attrs.update({(i, j): div16 for j in range(2)})
        elif name == "band":  # (left, right): the keys a query row may see, relative to its diagonal
            sig[name] = ("i32", "i32")
        elif name.endswith("_strides"):
            sig[name] = ("i32", "i32", "i32", "constexpr")
            consts[(i, 3)] = 1
            attrs.update({(i, j): div16 for j in range(3)})
        else:
            sig[name] = scalars.get(name, "i32")
            if name.startswith("stride"):
                attrs[(i,)] = div16
    return sig, consts, attrs


def compile_case(kernel: str, config: tuple[int, ...], d: int = 128, **options):
    """Compile one configuration of ``kernel`` for sm_90, non-causal, N a multiple of the tiles.

    "forward": bf16, options tma (default True) and warp_specialize (the lab variant
    :mod:`flashlab.lab.variants.forward_schedules`). "fp8": e4m3 with Q and K
    descales per block of 128 rows, TMA loads of Q, K and V; options v_block (128 or None: one V
    descale per head), and pipeline (False, "qk" or "pv") and rescale_threshold (None or theta),
    which compile the lab variant :mod:`flashlab.lab.variants.fp8_schedules` with the switches
    :func:`~flashlab.lab.variants.fp8_schedules.schedule_constexprs` derives from them (the
    teaching kernel :mod:`flashlab.kernels.fp8` when neither is set). "fa4": bf16, options
    poly_fraction and rescale_threshold as :func:`flashlab.kernels.fa4.flash_attention_fa4`
    takes them. "backward_one_pass": the one-pass bf16 backward (:mod:`flashlab.lab.variants.backward_one_pass`),
    option causal. Returns Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_report needs Triton's compiler, but TRITON_INTERPRET is set (the kernels are "
                           "interpreted functions then); run it in a process without TRITON_INTERPRET")
    bm, bn, warps, stages = config[:4]
    extra = {"maxnreg": config[4]} if len(config) > 4 else {}
    if kernel == "forward":
        from flashlab.kernels import forward as kf
        from flashlab.lab.variants import forward_schedules as fs

        tma = options.get("tma", True)
        desc = f"tensordesc<bf16[{bn}, {d}]>" if tma else "*bf16"
        pointers = {n: "*bf16" for n in ("Q", "K", "V", "O")} | {"LSE": "*fp32", "CU_Q": "*i32", "CU_K": "*i32"}
        cx = dict(D_HEAD=d, BLOCK_D=d, CAUSAL=False, WINDOW=False, VARLEN=False, UPCAST=False,
                  DOT_PRECISION="tf32", TMA=tma, BLOCK_M=bm, BLOCK_N=bn)
        if options.get("warp_specialize", False):  # the lab variant: the key loop warp-specialised
            fn = fs._forward_schedule_kernel
            cx.update(PER_HEAD=False, FORWARD_BLOCK=fs._forward_block_warp_specialized)
        else:
            fn = kf._forward_kernel.fn
        descriptors = {"DESC_K": desc, "DESC_V": desc} if tma else {"DESC_K": "*bf16", "DESC_V": "*bf16"}
        scalars = {"qk_scale": "fp32"}
    elif kernel == "fp8":
        from flashlab.kernels import fp8 as k8
        from flashlab.lab.variants import fp8_schedules

        pipeline, theta = options.get("pipeline", False), options.get("rescale_threshold")
        scheduled = bool(pipeline) or theta is not None
        fn = fp8_schedules._fp8_scheduled_kernel if scheduled else k8._fp8_forward_kernel.fn
        pointers = {"O": "*bf16"} | {n: "*fp32" for n in ("QD", "KD", "VD")}
        descriptors = {"Q": f"tensordesc<fp8e4nv[{bm}, {d}]>", "K": f"tensordesc<fp8e4nv[{bn}, {d}]>",
                       "V": f"tensordesc<fp8e4nv[{d}, {bn}]>"}
        cx = dict(D_HEAD=d, BLOCK_D=d, CAUSAL=False, Q_SB=128, K_SB=128, V_SB=options.get("v_block", 128) or 0,
                  EMULATE_CAST=False, TMA=True, TMA_Q=True, EVEN_N=True, BLOCK_M=bm, BLOCK_N=bn)
        if scheduled:
            cx.update(fp8_schedules.schedule_constexprs(pipeline, theta))
        scalars = {"qk_scale": "fp32"}
    elif kernel == "backward_one_pass":
        from flashlab.lab.variants import backward_one_pass as kh

        fn = kh._backward_kernel.fn
        pointers = {n: "*bf16" for n in ("K", "V", "DK", "DV")} | {n: "*fp32" for n in ("LSE", "DELTA", "DQ_ACC")}
        descriptors = {"DESC_Q": f"tensordesc<bf16[1, {bm}, {d}]>", "DESC_DO": f"tensordesc<bf16[1, {bm}, {d}]>",
                       "DESC_DQ": f"tensordesc<fp32[1, {bm}, {d}]>"}
        cx = dict(BLOCK_D=d, CAUSAL=options.get("causal", False), INTERPRET=False, BLOCK_M=bm, BLOCK_N=bn)
        scalars = {"qk_scale": "fp32", "scale": "fp32"}
    else:
        from flashlab.kernels import fa4 as k4

        fn = k4._fa4_kernel.fn
        theta = options.get("rescale_threshold")
        pointers = {n: "*bf16" for n in ("Q", "K", "V", "O")} | {"COUNT": "*i32"}
        descriptors = {}
        cx = dict(D_HEAD=d, BLOCK_D=d, CAUSAL=False, UPCAST=False, IEEE=False, COND=theta is not None, STATS=False,
                  POLY_SHIFT=k4.poly_shift(options.get("poly_fraction", 0.0)), C1=k4._C1, C2=k4._C2, C3=k4._C3,
                  BLOCK_M=bm, BLOCK_N=bn, stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1)
        scalars = {"qk_scale": "fp32", "theta": "fp32"}
    cx = {k: v for k, v in cx.items() if k in fn.arg_names}  # strides the kernel takes as tuples are typed there
    sig, consts, attrs = _signature(fn, pointers, descriptors, scalars, cx)
    src = ASTSource(fn, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", TARGET_ARCH, 32),
                          options=dict(num_warps=warps, num_stages=stages, **extra))


def _cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([str(_tools() / "cuobjdump"), flag, f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)


def loop_mix(sass: str) -> collections.Counter:
    """Opcode counts (first word of each instruction, predicate removed) of the key loop in
    ``sass``: the shortest span from a backward branch's target to the branch that holds both a
    tensor-core instruction (HGMMA or QGMMA) and an exponential (MUFU.EX2). Other spans with a
    GMMA are not the loop: retry jumps of barrier waits placed after it, masked tail loops (longer),
    or the last tile's P V and the store after a software-pipelined loop (no exponential). A static
    count: instructions a branch skips at run time (rescale_threshold's) are counted too."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(2))))
    best: list[str] | None = None
    for addr, text in ins:
        m = re.match(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            ops = [t.split()[0] for t in body]
            if (any("GMMA" in op for op in ops) and "MUFU.EX2" in ops
                    and (best is None or len(body) < len(best))):
                best = body
    return collections.Counter(t.split()[0].split(".")[0] for t in best or [])


class _quiet_stderr:
    """Silence file descriptor 2 (a failing MLIR pass prints its whole module there)."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
        return False


def report(kernel: str, config: tuple[int, ...], d: int = 128, **options) -> dict[str, object]:
    """One row: the configuration, then what the compiler made of it (see the module docstring)."""
    bm, bn, warps, stages = config[:4]
    row: dict[str, object] = {"kernel": kernel, "d": d, "BLOCK_M": bm, "BLOCK_N": bn, "warps": warps,
                              "stages": stages, "maxnreg": config[4] if len(config) > 4 else "",
                              "tma": options.get("tma", True), "warp_specialize": options.get("warp_specialize", False),
                              "pipeline": options.get("pipeline", False),
                              "v_block": (options.get("v_block", 128) or "head") if kernel == "fp8" else "",
                              "rescale_threshold": options.get("rescale_threshold", "")}
    try:
        with _quiet_stderr():
            k = compile_case(kernel, config, d, **options)
    except Exception as exc:  # a pass that gives up: keep the first line
        return row | {"status": f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}".replace(",", ";")}
    usage = _cuobjdump(k.asm["cubin"], "-res-usage")
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    total_warps = int(k.metadata.num_warps)
    mix = loop_mix(_cuobjdump(k.asm["cubin"], "-sass"))
    loop = sum(mix.values())
    scores = bm * bn / (32 * warps)  # scores one thread computes per iteration of the key loop
    fit_regs = REGISTERS_PER_SM // (32 * total_warps * regs)
    fit_smem = SHARED_PER_SM // max(1, int(k.metadata.shared) + 1024)  # 1 KB reserved per program
    return row | {
        "status": "ok", "registers": regs, "stack_bytes": stack, "shared_bytes": int(k.metadata.shared),
        "warp_specialized": "ttg.warp_specialize" in k.asm["ttgir"], "total_warps": total_warps,
        "programs_per_sm": min(fit_regs, fit_smem), "loop_instructions": loop,
        "instructions_per_score": round(loop / scores, 2) if loop else "",
        **{op.lower(): mix.get(op, 0) for op in OPCODES},
    }


def main(argv: list[str] | None = None) -> int:
    from flashlab.lab.bench import provenance
    from flashlab.lab.results import write

    parser = argparse.ArgumentParser(prog="python -m flashlab.lab.compile_report", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results", help="folder for compile_sm90.csv/.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="flashlab-sm90-"))
    rows = []
    for kernel, config, d, options in CASES:
        rows.append(report(kernel, config, d, **options))
        print(rows[-1], flush=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "") for k in keys} for r in rows]
    meta = provenance("python -m flashlab.lab.compile_report " + " ".join(argv if argv is not None else sys.argv[1:]))
    meta.update(gpu="none: compiled for sm_90 (H100/H200) on a CPU", driver="none",
                note="Offline compilation with this record's Triton; no kernel was run. programs_per_sm counts "
                     "registers and shared memory only (no allocation granularity).")
    for path in write("compile_sm90", rows, meta, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
