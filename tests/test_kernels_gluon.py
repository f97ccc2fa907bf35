"""The Gluon FlashAttention-3 forward (flashlab.kernels.fa3).

Gluon has no interpreter, so on a CPU the kernel is compiled for sm_90 (H100/H200) and the test
reads the compiled code for FA3's structure (§3.1-3.2):

- warp specialisation: a ``ttg.warp_specialize`` region asking 240 registers for the second
  consumer warpgroup and 24 for the producer warp; 12 warps = 3 warpgroups;
- register reallocation: ``setmaxnreg`` down to 24 (producer) and up to 240 (consumers);
- the producer/consumer ring: TMA loads (``cp.async.bulk.tensor``) completing on mbarriers
  (``mbarrier.arrive.expect_tx``), waited for with ``mbarrier.try_wait``;
- the GEMMs: ``wgmma`` for S = Q K^T from shared memory and O += P V with P from registers;
- intra-warpgroup overlap: ``wgmma.wait_group 1`` (S is ready while P V may still run);
- ping-pong: the turn barriers add waits that the ``pingpong=False`` build does not have;
- the default build of each head dimension follows ``fa3.SWITCHES`` and ``fa3.CONSUMERS``, and
  d = 64 builds with the other number of consumer warpgroups too;
- persistence: one program per SM takes tiles in turn, and O leaves through shared memory by a
  TMA store (``cp.async.bulk.tensor`` to global) that runs while the next tile begins;
- no register spills in the key-block loop and shared memory within the 227 KB of a CTA.

On a Hopper GPU (marker ``gpu``): against the float64 reference under the flash-attn rule (max
error at most twice that of plain PyTorch attention in the same precision, plus 1e-5, and within
bf16 2e-2 / fp16 2e-3), lse against the reference and against flash_attention's, causal and not,
ragged N, N_q != N_k, several heads and batches; the race check (same inputs twice give identical
bits; an output buffer filled with NaN is overwritten everywhere).
"""

from __future__ import annotations

import functools
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this triton has no Gluon for Hopper")

import triton
from gluon_probes import cuobjdump
from tiers import GPU, needs_gpu, sm90_build_env

from flashlab.kernels import fa3, fa3_fp8
from flashlab.lab.experiments import fa3 as experiment

# Triton versions the kernel was compiled with; on others a compile error skips (Gluon's API moves).
VERIFIED_TRITON = ("3.6.", "3.9.")
# d = 256 in bf16 only: its builds are the slowest to compile, and fp16 adds nothing d = 64 and 128 do not check
COMBOS = ([(dtype, d, causal) for dtype in fa3.DTYPES for d in (64, 128) for causal in (False, True)]
          + [(torch.bfloat16, 256, causal) for causal in (False, True)])


# The sm_90 builds, compiled in a fresh process: kernels run under TRITON_INTERPRET patch
# triton.language in this one, and a Gluon kernel compiled after them would not build.
_BUILD = """
import base64, json, sys, torch
from flashlab.kernels import fa3, fa3_fp8
from flashlab.lab.variants import fa3_schedules
out = {}
for dtype, d, causal, pingpong in json.loads(sys.argv[1]):
    key = f"{dtype}-{d}-{causal}-{pingpong}"
    try:
        if dtype == "float8_e4m3fn" and pingpong == "theta2":  # the FP8 kernel, rescale_threshold = 2
            k = fa3_fp8.compile_sm90(d, causal, rescale_threshold=2)
        elif dtype == "float8_e4m3fn" and pingpong == "poly0.5":  # the FP8 kernel, poly_fraction = 1/2
            k = fa3_fp8.compile_sm90(d, causal, poly_fraction=0.5)
        elif dtype == "float8_e4m3fn" and pingpong == "regs":  # P from registers at Bc = 128
            k = fa3_fp8.compile_sm90(d, causal, p_smem=False)
        elif dtype == "float8_e4m3fn" and pingpong == "consumers3":  # three consumers, P through shared memory
            k = fa3_fp8.compile_sm90(d, causal, consumers=3)
        elif dtype == "float8_e4m3fn" and str(pingpong).startswith("psmem-"):  # p_smem, "psmem-<k_block or 0>"
            k = fa3_fp8.compile_sm90(d, causal, k_block=int(pingpong[6:]) or None, p_smem=True)
        elif dtype == "float8_e4m3fn" and pingpong == "stamps":  # the FP8 kernel with time stamps
            k = fa3_fp8.compile_sm90(d, causal, stamps=True)
        elif dtype == "float8_e4m3fn" and pingpong == "lmma":  # l summed by the tensor cores
            k = fa3_fp8.compile_sm90(d, causal, l_mma=True)
        elif dtype == "float8_e4m3fn" and pingpong == "lmma-serial":  # the same, without the overlap
            k = fa3_fp8.compile_sm90(d, causal, l_mma=True, overlap=False)
        elif dtype == "float8_e4m3fn" and pingpong == "stamps-psmem":  # stamps, 256-key blocks
            k = fa3_fp8.compile_sm90(d, causal, stamps=True, p_smem=True)
        elif dtype == "float8_e4m3fn" and isinstance(pingpong, str):  # the FP8 kernel, "switches-P-O"
            _, p, o = pingpong.split("-")
            k = fa3_fp8.compile_sm90(d, causal, pingpong=p == "1", overlap=o == "1")
        elif dtype == "float8_e4m3fn":  # the FP8 kernel as it runs by default
            k = fa3_fp8.compile_sm90(d, causal)
        elif pingpong == "stamps":  # the build with time stamps
            k = fa3.compile_sm90(getattr(torch, dtype), d, causal, stamps=True)
        elif isinstance(pingpong, str) and pingpong.startswith("switches"):  # "switches-P-O[-W]": _switch_key
            _, p, o, *w = pingpong.split("-")
            k = fa3.compile_sm90(getattr(torch, dtype), d, causal, p == "1", o == "1",
                                 consumers=int(w[0]) if w else None)
        elif isinstance(pingpong, str):  # an ablation schedule
            k = fa3_schedules.compile_sm90(pingpong, getattr(torch, dtype), d, causal)
        elif pingpong is None:  # what forward runs by default (fa3.SWITCHES)
            k = fa3.compile_sm90(getattr(torch, dtype), d, causal)
        else:
            k = fa3.compile_sm90(getattr(torch, dtype), d, causal, pingpong, overlap=True)
        out[key] = {"ptx": k.asm["ptx"], "ttgir": k.asm["ttgir"], "cubin": base64.b64encode(k.asm["cubin"]).decode(),
                    "num_warps": k.metadata.num_warps, "shared": k.metadata.shared}
    except Exception as exc:
        out[key] = {"error": str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}
print(json.dumps(out))
"""
FP8_COMBOS = [(d, causal) for d in (64, 128) for causal in (False, True)]
P_SMEM_BUILDS = [(128, 0), (128, 128), (64, 128)]  # (d, k_block or 0): fa3_fp8's p_smem, not causal
L_MMA_BUILDS = [(128, False), (128, True), (64, False), (64, True)]  # (d, causal): l_mma=True, d's default build
FP8_SWITCH_BUILDS = [(True, True), (False, True), (True, False), (False, False)]  # (pingpong, overlap)
SCHEDULE_BUILDS = [("no_overlap", 128, False), ("no_warp_specialization", 128, False),
                   ("no_warp_specialization", 64, True)]
# (d, causal, consumers) of test_default_build_follows_the_switches: each default build (None),
# and at d = 64 the other number of consumer warpgroups (5 - 2 = 3, 5 - 3 = 2)
# (d = 256 runs d = 128's switches: its default builds are test_compiled_code_has_fa3_structure's)
SWITCH_BUILDS = ([(d, c, None) for d in (64, 128) for c in (False, True)]
                 + [(64, c, 5 - fa3.CONSUMERS[(64, c)]) for c in (False, True)])


@functools.cache
def _builds() -> dict:
    import json
    import sys

    wanted = [(str(t).removeprefix("torch."), d, c, True) for t, d, c in COMBOS] + [("bfloat16", 128, False, False)]
    wanted += [("float8_e4m3fn", d, c, True) for d, c in FP8_COMBOS]
    wanted += [("float8_e4m3fn", d, c, "regs") for d, c in FP8_COMBOS]
    wanted += [("float8_e4m3fn", 128, False, _switch_key(p, o)) for p, o in FP8_SWITCH_BUILDS]
    wanted += [("float8_e4m3fn", 64, False, _switch_key(True, True))]
    wanted += [("float8_e4m3fn", d, False, "theta2") for d in (64, 128)]
    wanted += [("float8_e4m3fn", 128, False, "stamps"), ("float8_e4m3fn", 128, False, "stamps-psmem")]
    wanted += [("float8_e4m3fn", d, False, f"psmem-{kb}") for d, kb in P_SMEM_BUILDS]
    wanted += [("float8_e4m3fn", d, False, "consumers3") for d in (64, 128)]
    wanted += [("float8_e4m3fn", d, c, "lmma") for d, c in L_MMA_BUILDS]
    wanted += [("float8_e4m3fn", 128, False, "lmma-serial")]
    wanted += [("float8_e4m3fn", d, False, "poly0.5") for d in (64, 128)]
    wanted += [("bfloat16", d, c, name) for name, d, c in SCHEDULE_BUILDS]
    wanted += [("bfloat16", 128, False, "stamps")]
    wanted += [("bfloat16", d, c, None) for d in (64, 128) for c in (False, True)]
    # what test_default_build_follows_the_switches reads: d = 64 with the other number of consumers,
    # and each two-consumer build with ping-pong flipped
    for d, c, w in SWITCH_BUILDS:
        p, o = fa3.switches(d)
        if w is not None:
            wanted.append(("bfloat16", d, c, _switch_key(p, o, w)))
        if fa3.consumer_count(d, p, o, c, w) == 2:
            wanted.append(("bfloat16", d, c, _switch_key(not p, o)))
    wanted = list(dict.fromkeys(wanted))
    run = subprocess.run([sys.executable, "-c", _BUILD, json.dumps(wanted)], capture_output=True, text=True,
                         env=sm90_build_env(), timeout=600, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _switch_key(pingpong: bool, overlap: bool, consumers: int | None = None) -> str:
    """The build key of fa3.compile_sm90 with these two switches (and this many consumer
    warpgroups; None: fa3.consumer_count's default)."""
    return f"switches-{int(pingpong)}-{int(overlap)}" + ("" if consumers is None else f"-{consumers}")


def _compiled(dtype: torch.dtype, d: int, causal: bool, pingpong: bool | str | None = True):
    import base64
    from types import SimpleNamespace

    build = _builds()[f"{str(dtype).removeprefix('torch.')}-{d}-{causal}-{pingpong}"]
    if "error" in build:
        if triton.__version__.startswith(VERIFIED_TRITON):
            raise AssertionError(f"the kernel does not compile for sm_90: {build['error']}")
        pytest.skip(f"the kernel does not compile with triton {triton.__version__}: {build['error'][:120]}")
    asm = {"ptx": build["ptx"], "ttgir": build["ttgir"], "cubin": base64.b64decode(build["cubin"])}
    return SimpleNamespace(asm=asm, metadata=SimpleNamespace(num_warps=build["num_warps"], shared=build["shared"]))


def _resource_usage(cubin: bytes) -> str:
    """``cuobjdump -res-usage`` of the cubin (REG, STACK, LOCAL, SHARED); empty without cuobjdump."""
    return cuobjdump(cubin, "-res-usage")


def _sass(cubin: bytes) -> str:
    """``cuobjdump -sass`` of the cubin; empty without cuobjdump."""
    return cuobjdump(cubin, "-sass")


def _instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) of every instruction in ``cuobjdump -sass`` output."""
    return [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def key_block_loops(sass: str, marker: str = "DEPBAR.LE gsb0, 0x1") -> list[list[str]]:
    """The instructions of each key-block loop in ``sass``: a backward branch's body holding two
    wgmma (HGMMA, or QGMMA for FP8) and ``marker``, by default the intra-warpgroup wait
    ``DEPBAR.LE gsb0, 0x1`` (a build without the overlap: ``MUFU.EX2``), one a consumer. The tile
    loop of a persistent program holds all that too but is about twice as long (the first
    block's S, the last P V, the epilogue); ptxas may place the inner loop's body outside the
    outer one's address range, so the loops are told apart by length."""
    ins = _instructions(sass)
    loops = []
    for addr, op in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", op)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            body = [o for a, o in ins if start <= a <= addr]
            if sum("GMMA" in o for o in body) >= 2 and any(marker in o for o in body):
                loops.append(body)
    shortest = min((len(b) for b in loops), default=0)
    return [b for b in loops if len(b) < 1.5 * shortest]


def local_memory_in_key_block_loops(cubin: bytes, marker: str = "DEPBAR.LE gsb0, 0x1") -> int | None:
    """Local-memory loads and stores (spills) inside the key-block loops, None without cuobjdump.
    A few registers a persistent program saves per tile cost nothing; one in the loop costs every
    key block."""
    sass = _sass(cubin)
    if not sass:
        return None
    loops = key_block_loops(sass, marker)
    assert loops, "no key-block loop found in the SASS"
    return _local_accesses(loops)


def _local_accesses(loops: list[list[str]]) -> int:
    """Local-memory loads and stores (LDL, STL; predicated or not) in these loop bodies."""
    return sum(bool(re.match(r"(@!?U?P\d+ )?(LDL|STL)", o.strip())) for body in loops for o in body)


def _register_budgets(ptx: str) -> set[int]:
    """The register counts the setmaxnreg instructions of a build move its warpgroups to."""
    return {int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)}


def _turn_waits_follow(ptx: str, flipped_ptx: str, pingpong: bool) -> None:
    """The turn barriers add mbarrier waits exactly when ``pingpong``: more than the build with
    ping-pong the other way when on, fewer when off."""
    waits = ptx.count("mbarrier.try_wait"), flipped_ptx.count("mbarrier.try_wait")
    assert (waits[0] > waits[1]) == pingpong and waits[0] != waits[1], waits


def test_n_q_is_never_a_compile_time_constant():
    """Triton makes an integer argument equal to 1 a constant; with N_q = 1 constant the tile's
    query rows fold to constants that Triton 3.6 cannot lower (the GPU case N_q = 1 failed to
    compile), so both persistent kernels opt out for N_q."""
    for kernel in (fa3._fa3_kernel, fa3_fp8._fa3_fp8_kernel):
        assert [p.name for p in kernel.params if p.do_not_specialize] == ["N_Q", "DEAL"]


def _dealt(n_q: int, bh: int, sm_count: int, causal: bool, rows: int = 128) -> list[list[tuple[int, int, int]]]:
    """The tiles of ``rows`` query rows (two or three consumers' Br) each program of the
    persistent kernel takes, as (head, query tile, key blocks): _tile_count and _tile written
    again in Python (Gluon kernels cannot run on a CPU)."""
    programs, deal = fa3.schedule(-(-n_q // rows) * bh, causal, sm_count)
    n_m = -(-n_q // rows)
    n_tiles = n_m * bh
    out = []
    for pid in range(programs):
        deals = n_tiles // deal
        mine = max(deals - pid + programs - 1, 0) // programs
        owns_last = deals >= pid and (deals - pid) % programs == 0
        tiles = []
        for j in range(deal * mine + (n_tiles % deal if owns_last else 0)):
            t = deal * (pid + (j // deal) * programs) + j % deal
            i = t % n_m if (t // n_m) % 2 == 0 else n_m - 1 - t % n_m
            mt = n_m - 1 - i // 2 if i % 2 == 0 else i // 2
            hi = min((mt + 1) * rows, n_q) if causal else n_q
            tiles.append((t // n_m, mt, -(-hi // fa3.BLOCK_N)))
        out.append(tiles)
    return out


@pytest.mark.parametrize("n_q, bh", [(4096, 64), (16384, 16), (131072, 16), (1000, 3), (333, 8), (64, 1),
                                     (2048, 200), (4224, 64), (6000, 16), (2176, 32)])
@pytest.mark.parametrize("consumers", [2, 3])
def test_persistent_programs_take_every_tile_once_and_even_loads(n_q, bh, consumers):
    """Every (head, query tile) is taken by exactly one program. Without the mask no program takes
    more tiles than a whole-tile split must give one; causal, the busiest program's work exceeds
    the mean by at most one pair of tiles, which is what splitting whole pairs costs (dealing
    causal tiles one at a time round-robin put the busiest at 1.56 times the mean at N = 16k,
    some 6 pairs over it; pairs spanning two heads as (middle, longest) put it at 1.42 at
    N = 4224)."""
    rows = consumers * fa3.BLOCK_M
    for causal in (False, True):
        dealt = _dealt(n_q, bh, 132, causal, rows)
        taken = [(h, mt) for tiles in dealt for h, mt, _ in tiles]
        assert sorted(taken) == [(h, mt) for h in range(bh) for mt in range(-(-n_q // rows))]
        work = [sum(n for *_, n in tiles) + 2 * len(tiles) for tiles in dealt]  # 2: a tile's own cost
        if not causal:
            assert max(len(tiles) for tiles in dealt) == -(-len(taken) // len(dealt))
        else:
            pair = 2 * max(n for tiles in dealt for *_, n in tiles) + 4  # at most two of the longest
            assert max(work) <= sum(work) / len(work) + pair, (max(work), sum(work) / len(work), pair)


def test_spill_finder_finds_a_spill_in_the_loop():
    """key_block_loops sees a spill inside the loop and not one outside it."""
    fake = "\n".join(f"/*{a:04x}*/ {op} ;" for a, op in [
        (0x10, "STL [R1], R9"), (0x20, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24"),
        (0x30, "LDL R10, [R1]"), (0x40, "HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR12], R88"),
        (0x50, "WARPGROUP.DEPBAR.LE gsb0, 0x1"), (0x60, "@P1 BRA 0x20"), (0x70, "HGMMA.64x128x16.F32.BF16 R24"),
        (0x80, "HGMMA.64x128x16.F32.BF16 R88"), (0x90, "NOP"), (0xa0, "NOP"), (0xb0, "@P2 BRA 0x10")])
    loops = key_block_loops(fake)
    assert len(loops) == 1 and sum(o.strip().startswith("LDL") for o in loops[0]) == 1
    assert not any(o.strip().startswith("STL") for o in loops[0])


def _no_spills_in_the_loop(cubin: bytes, per_loop: int = 0, marker: str = "DEPBAR.LE gsb0, 0x1",
                           consumers: int = 2, stack: int = 64) -> None:
    """A persistent program may keep a few registers of the tile loop on the stack (at most
    ``stack`` bytes, touched once per tile); each of the ``consumers`` key-block loops (found by
    ``marker``: see key_block_loops) touches local memory at most ``per_loop`` times an iteration."""
    usage = _resource_usage(cubin)
    if usage:
        assert int(re.search(r"STACK:(\d+) ", usage).group(1)) <= stack and re.search(r"LOCAL:0 ", usage), usage
        loops = key_block_loops(_sass(cubin), marker)
        assert len(loops) >= consumers, f"found {len(loops)} key-block loops for {consumers} consumers"
        assert _local_accesses(loops) <= consumers * per_loop


def _ids(combo) -> str:
    dtype, d, causal = combo
    return f"{str(dtype).removeprefix('torch.')}-d{d}-{'causal' if causal else 'full'}"


# --------------------------------------------------------------- compiled for sm_90, on any machine
@pytest.mark.parametrize("combo", COMBOS, ids=_ids)
def test_compiled_code_has_fa3_structure(combo):
    dtype, d, causal = combo
    k = _compiled(dtype, d, causal)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    # warp specialisation: the default partition (consumer 0) + consumer 1 (240 regs) + producer (24)
    assert "ttg.warp_specialize" in ttgir
    assert f"requestedRegisters = array<i32: {int(fa3.CONSUMER_REGS)}, {int(fa3.PRODUCER_REGS)}>" in ttgir
    assert k.metadata.num_warps == 12, "4 + 4 + 1 warps, rounded up to three warpgroups"
    assert int(fa3.PRODUCER_REGS) <= 40 and int(fa3.CONSUMER_REGS) >= 200, "the producer gives registers up"
    budgets = _register_budgets(ptx)
    assert {int(fa3.PRODUCER_REGS), int(fa3.CONSUMER_REGS)} <= budgets, budgets
    # the ring: TMA copies that complete on mbarriers, waited for by the consumers
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.arrive.expect_tx" in ptx and "mbarrier.try_wait" in ptx
    # the GEMMs: m64 per warpgroup; S = Q K^T with both operands in shared memory (descriptors),
    # O += P V with P (the A operand) in registers
    gemm = rf"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.{'bf16' if dtype == torch.bfloat16 else 'f16'}"
    assert re.search(gemm + r"\.\w+ \{[^}]*\}, %rd", ptx), "S = Q K^T from shared memory"
    assert re.search(gemm + r"\.\w+ \{[^}]*\}, \{", ptx), "O += P V with P from registers"
    assert "wgmma.wait_group.sync.aligned 1;" in ptx, "intra-warpgroup overlap: wait for S while P V runs"
    # the epilogue: O leaves through shared memory and a TMA store; at d = 256, whose K and V
    # blocks leave no room for two O tiles, from registers by plain stores
    tma_store = "cp.async.bulk.tensor.2d.global.shared" in ptx and "cp.async.bulk.wait_group" in ptx
    assert tma_store == (d <= 128) and "st.global" in ptx
    # persistent: each program loops over tiles, striding by the grid size
    assert "%nctaid.x" in ptx
    # no spills in the key-block loop; shared memory within one CTA's 227 KB
    _no_spills_in_the_loop(k.asm["cubin"])
    assert k.metadata.shared <= 227 * 1024


def test_pingpong_adds_the_turn_barriers():
    on, off = _compiled(torch.bfloat16, 128, False, True), _compiled(torch.bfloat16, 128, False, False)
    waits = lambda k: k.asm["ptx"].count("mbarrier.try_wait")
    arrives = lambda k: len(re.findall(r"mbarrier\.arrive\.shared", k.asm["ptx"]))
    assert waits(on) > waits(off) and arrives(on) > arrives(off)


def test_time_stamps_are_compiled_only_when_asked():
    """STAMPS=True reads %globaltimer and the SM's %clock64 at each phase and stores them; the
    default build reads neither. The stamped build keeps the partitions and the register budgets.
    (It may spill a few registers to the stack, which the default build must not: see
    test_compiled_code_has_fa3_structure.)"""
    stamped, plain = _compiled(torch.bfloat16, 128, False, "stamps"), _compiled(torch.bfloat16, 128, False)
    assert "%globaltimer" in stamped.asm["ptx"] and "%clock64" in stamped.asm["ptx"]
    assert "%globaltimer" not in plain.asm["ptx"] and "%clock64" not in plain.asm["ptx"]
    assert "ttg.warp_specialize" in stamped.asm["ttgir"]
    ptx = stamped.asm["ptx"]
    budgets = _register_budgets(ptx)
    assert {int(fa3.PRODUCER_REGS), int(fa3.CONSUMER_REGS)} <= budgets, budgets


def test_stamp_args_check_the_buffer():
    """One check for every Gluon kernel's stamp buffer (the forward, the FP8 forward, the
    backward): none means no stamping; a buffer of another shape or dtype is refused by name."""
    assert fa3.stamp_args(None, 3, (2, 3), torch.device("cpu")) == {}
    good = torch.zeros((2, 3), dtype=torch.int64)
    assert fa3.stamp_args(good, 3, (2, 3), torch.device("cpu")) == dict(STAMP=good, STAMP_AT=3, STAMPS=True)
    for bad in (torch.zeros((3, 2), dtype=torch.int64), torch.zeros((2, 3), dtype=torch.int32)):
        with pytest.raises(ValueError, match=r"stamps must be an int64 tensor of shape \(2, 3\)"):
            fa3.stamp_args(bad, 0, (2, 3), torch.device("cpu"))


@pytest.mark.parametrize("build", ["stamps", "stamps-psmem"])
def test_fp8_time_stamps_are_compiled_only_when_asked(build):
    """The FP8 kernel's STAMPS builds (128-key blocks, P in registers; 256-key blocks, P through
    shared memory) read both clocks; its default build reads neither. The 128-key stamped loops
    touch no local memory; the 256-key ones, whose registers the stamps' 64-bit clocks crowd,
    at most 4 accesses in some 1,400 instructions a loop (Triton 3.6's ptxas)."""
    stamped = _compiled(torch.float8_e4m3fn, 128, False, build)
    plain = _compiled(torch.float8_e4m3fn, 128, False, True)
    assert "%globaltimer" in stamped.asm["ptx"] and "%clock64" in stamped.asm["ptx"]
    assert "%globaltimer" not in plain.asm["ptx"] and "%clock64" not in plain.asm["ptx"]
    loops = key_block_loops(_sass(stamped.asm["cubin"]))
    if not loops:
        pytest.skip("cuobjdump is not installed")
    spills = _local_accesses(loops)
    assert len(loops) == 2 and spills <= (4 if build == "stamps-psmem" else 0), ([len(b) for b in loops], spills)
    stores = sum(op.startswith("STS") for loop in loops for op in _opcodes(loop))  # P to shared memory
    assert (stores > 0) == (build == "stamps-psmem"), stores


def test_config_fits_shared_memory():
    for d in fa3.HEAD_DIMS:
        c = fa3.config(d)
        q_and_o = 2 * (2 if d <= 128 else 1) * c["BLOCK_M"] * d  # two consumers' Q, and O's tiles up to d = 128
        elements = q_and_o + c["STAGES"] * 2 * c["BLOCK_N"] * d  # then K and V per stage
        assert 2 * elements <= 227 * 1024 - 1024
        assert c["BLOCK_M"] == 64, "wgmma's M is 64 per warpgroup"


# --------------------------------------------------------------- the ablation's schedules, compiled
@pytest.mark.parametrize("d, causal, consumers", SWITCH_BUILDS)
def test_default_build_follows_the_switches(d, causal, consumers):
    """What forward runs by default (fa3.SWITCHES: both on at d = 128, both off at 64): the
    overlap's wait for S alone and the turn barriers exactly when the switches say so; the
    consumer warpgroups of fa3.CONSUMERS, and at d = 64 the other count when asked. Three:
    4 + 4 + 4 + 1 warps, four warpgroups, 168 registers for consumer 0, 160 for the other two, 24
    for the producer. No spills in the key-block loops; the persistent
    tile loop may keep a few registers on the stack (at most 64 bytes, 128 with three consumers)."""
    pingpong, overlap = fa3.switches(d)
    n_wg = fa3.consumer_count(d, pingpong, overlap, causal, consumers)
    k = _compiled(torch.bfloat16, d, causal, None if consumers is None else _switch_key(pingpong, overlap, consumers))
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    assert ("wgmma.wait_group.sync.aligned 1;" in ptx) == overlap
    if n_wg == 2:
        _turn_waits_follow(ptx, _compiled(torch.bfloat16, d, causal, _switch_key(not pingpong, overlap)).asm["ptx"],
                           pingpong)
    else:
        assert not pingpong
    assert "ttg.warp_specialize" in ttgir and k.metadata.num_warps == 4 * (n_wg + 1)
    budgets = _register_budgets(ptx)
    if n_wg == 3:
        assert f"requestedRegisters = array<i32: {int(fa3.CONSUMER_REGS_3)}, {int(fa3.CONSUMER_REGS_3)}, " \
               f"{int(fa3.PRODUCER_REGS)}>" in ttgir
        default_regs = 4 * fa3.MAXNREG_3 - 2 * int(fa3.CONSUMER_REGS_3) - int(fa3.PRODUCER_REGS)
        assert {int(fa3.CONSUMER_REGS_3), int(fa3.PRODUCER_REGS), default_regs} <= budgets, budgets
    else:
        assert {int(fa3.CONSUMER_REGS), int(fa3.PRODUCER_REGS)} <= budgets, budgets
    _no_spills_in_the_loop(k.asm["cubin"], marker="DEPBAR.LE gsb0, 0x1" if overlap else "MUFU.EX2",
                           consumers=n_wg, stack=128 if n_wg == 3 else 64)
    assert k.metadata.shared <= 227 * 1024


def test_consumer_count_and_what_it_refuses():
    assert fa3.consumer_count(64, False, False, False) == fa3.CONSUMERS[(64, False)]
    assert fa3.consumer_count(64, False, False, True) == 2
    assert fa3.consumer_count(64, True, True, False) == 2 and fa3.consumer_count(64, False, True, False) == 2
    assert fa3.consumer_count(64, True, False, False) == 2 and fa3.consumer_count(128, False, False, False) == 2
    assert fa3.consumer_count(64, False, False, False, 2) == 2 and fa3.consumer_count(64, False, False, True, 3) == 3
    with pytest.raises(ValueError, match="three consumers need pingpong and overlap off; got pingpong = True"):
        fa3.consumer_count(64, True, False, False, 3)
    with pytest.raises(ValueError, match="got pingpong = False, overlap = True"):
        fa3.consumer_count(64, False, True, True, 3)
    with pytest.raises(ValueError, match=r"consumers must be one of \(2,\) at d = 128; got 3"):
        fa3.consumer_count(128, False, False, False, 3)
    with pytest.raises(ValueError, match=r"consumers must be one of \(2, 3\) at d = 64; got True"):
        fa3.consumer_count(64, False, False, False, True)
    with pytest.raises(ValueError, match="three consumers need pingpong and overlap off"):
        fa3.compile_sm90(torch.bfloat16, 64, False, pingpong=True, consumers=3)


def test_no_overlap_waits_for_both_gemms():
    """overlap=False: no wgmma.wait_group 1 (S is never awaited while P V runs); partitions kept."""
    k = _compiled(torch.bfloat16, 128, False, "no_overlap")
    ptx = k.asm["ptx"]
    assert "wgmma.wait_group.sync.aligned 1;" not in ptx
    assert "ttg.warp_specialize" in k.asm["ttgir"] and "setmaxnreg" in ptx
    assert "wgmma.wait_group.sync.aligned 1;" in _compiled(torch.bfloat16, 128, False).asm["ptx"]


@pytest.mark.parametrize("d, causal", [(128, False), (64, True)])
def test_no_warp_specialization_is_one_partition(d, causal):
    """No producer, no partitions, no register reallocation: 8 warps that issue their own TMA
    loads (completing on mbarriers) and keep the intra-warpgroup overlap."""
    k = _compiled(torch.bfloat16, d, causal, "no_warp_specialization")
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    assert "ttg.warp_specialize" not in ttgir and "setmaxnreg" not in ptx
    assert k.metadata.num_warps == 8
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.try_wait" in ptx and "bar.sync" in ptx
    assert "wgmma.wait_group.sync.aligned 1;" in ptx
    usage = _resource_usage(k.asm["cubin"])
    if usage:
        assert re.search(r"STACK:0 ", usage) and re.search(r"LOCAL:0 ", usage), usage


# --------------------------------------------------------------- the FP8 kernel, compiled
# How much stack a build may keep and how often its key-block loops may touch local memory.
# Two consumers with P from registers: the tile loop's few registers; Triton 3.9's ptxas reloads
# one scalar a key block (3.6's none). Three consumers (the d = 64 default): nothing. The 256-key
# blocks (the d = 128 default) keep more of the tile loop on the stack (96 bytes; 216 with the
# mask), and with the mask ptxas finds three key-block loops of 1,579, 1,593 and 2,322
# instructions touching local memory 0, 2 and 7 times an iteration (L1 hits; run 27 timed these
# builds faster than Bc = 128's).
def _fp8_spill_limits(c: dict, causal: bool) -> dict:
    if c["CONSUMERS"] == 3:
        return dict(stack=64, per_loop=0, consumers=3)
    if c["P_SMEM"]:
        return dict(stack=256, per_loop=3, consumers=3) if causal else dict(stack=128, per_loop=0)
    return dict(stack=64, per_loop=1)


@pytest.mark.parametrize("build", [True, "regs"], ids=["default", "p-from-registers"])
@pytest.mark.parametrize("d, causal", FP8_COMBOS)
def test_fp8_compiled_code_has_fa3_structure(d, causal, build):
    """Partitions, setmaxnreg, the TMA/mbarrier ring; e4m3 wgmma with S from shared memory, and P
    from registers or, where :func:`fa3_fp8.config` says so (the defaults: three consumers at
    d = 64, 256-key blocks at d = 128), from shared memory; the intra-warpgroup wait; no spills
    beyond :func:`_fp8_spill_limits`. The build of ``p_smem=False`` takes P from registers with
    two consumers at every d."""
    c = fa3_fp8.config(d, p_smem=False if build == "regs" else None)
    assert c["CONSUMERS"] == (fa3_fp8.CONSUMERS[d] if build is True else 2)
    k = _compiled(torch.float8_e4m3fn, d, causal, build)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    three = c["CONSUMERS"] == 3
    assert "ttg.warp_specialize" in ttgir and k.metadata.num_warps == (16 if three else 12)
    budgets = _register_budgets(ptx)
    assert {int(fa3.PRODUCER_REGS), 160 if three else int(fa3.CONSUMER_REGS)} <= budgets, budgets
    assert "cp.async.bulk.tensor.2d" in ptx and "mbarrier.arrive.expect_tx" in ptx and "mbarrier.try_wait" in ptx
    gemm = r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3"
    from_shared = re.findall(gemm + r" \{[^}]*\}, %rd", ptx)
    assert from_shared, "S = Q K^T from shared memory"
    assert bool(re.search(gemm + r" \{[^}]*\}, \{", ptx)) != c["P_SMEM"], "O += P V: P's operand"
    if c["P_SMEM"]:  # O += P V reads P from shared memory: n = d beside S's n = Bc
        assert {str(d), str(c["BLOCK_N"])} <= set(from_shared), from_shared
        assert "st.shared.v4" in ptx, "P stored 16 bytes a thread at a time"
    assert "wgmma.wait_group.sync.aligned 1;" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx and "%nctaid.x" in ptx
    _no_spills_in_the_loop(k.asm["cubin"], **_fp8_spill_limits(c, causal))
    assert k.metadata.shared <= 227 * 1024


@pytest.mark.parametrize("pingpong, overlap", FP8_SWITCH_BUILDS)
def test_fp8_switches_change_the_schedule(pingpong, overlap):
    """The FP8 kernel's two switches, as the bf16 kernel's: the overlap's wait for S alone exactly
    when ``overlap``, the turn barriers' waits exactly when ``pingpong`` (against the build with
    ping-pong the other way), the partitions and register budgets either way, local memory
    within :func:`_fp8_spill_limits` of the default build's P operand."""
    k = _compiled(torch.float8_e4m3fn, 128, False, _switch_key(pingpong, overlap))
    ptx = k.asm["ptx"]
    assert ("wgmma.wait_group.sync.aligned 1;" in ptx) == overlap
    _turn_waits_follow(ptx, _compiled(torch.float8_e4m3fn, 128, False, _switch_key(not pingpong, overlap)).asm["ptx"],
                       pingpong)
    assert "ttg.warp_specialize" in k.asm["ttgir"] and k.metadata.num_warps == 12
    budgets = _register_budgets(ptx)
    assert {int(fa3.PRODUCER_REGS), int(fa3.CONSUMER_REGS)} <= budgets, budgets
    limits = _fp8_spill_limits(fa3_fp8.config(128), False)
    _no_spills_in_the_loop(k.asm["cubin"], marker="DEPBAR.LE gsb0, 0x1" if overlap else "MUFU.EX2", **limits)


def test_fp8_default_build_follows_its_switches():
    """What the FP8 kernel runs by default is the build of fa3_fp8.SWITCHES' setting."""
    default = _compiled(torch.float8_e4m3fn, 128, False).asm["ptx"]
    chosen = _compiled(torch.float8_e4m3fn, 128, False, _switch_key(*fa3_fp8.SWITCHES[128])).asm["ptx"]
    assert default == chosen


def _skipped_rescales(sass: str, head_d: int) -> int:
    """Conditional forward branches in ``sass`` that jump over exactly O's rescale: head_d / 2
    FMUL a thread (a 64-row O of head_d columns over a warpgroup's 128 threads) and nothing else."""
    ins = _instructions(sass)
    count = 0
    for addr, op in ins:
        m = re.match(r"@!?U?P\d BRA (0x[0-9a-f]+)", op)
        if m and int(m.group(1), 16) > addr:
            body = [o for a, o in ins if addr < a < int(m.group(1), 16)]
            count += len(body) == head_d // 2 and all(o.startswith("FMUL") for o in body)
    return count


def _opcodes(body: list[str]) -> list[str]:
    """The opcode of each SASS instruction of a loop body, its predicate (``@P0``, ``@!UP1``) removed."""
    return [re.sub(r"^@!?U?P\w+ ", "", o.strip()).split()[0] for o in body]


def _p_from_shared_memory_loops(kernel, consumers: int) -> list[list[str]] | None:
    """The opcodes of the key-block loops of an FP8 build whose P V reads P from shared memory:
    checks that no P V wgmma takes registers as its A operand, and that the ``consumers`` shortest
    loops (the consumers'; a tile loop around them can pass for one more) touch no local memory.
    None without cuobjdump."""
    assert not re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3 \{[^}]*\}, \{",
                         kernel.asm["ptx"]), "P V with P from registers"
    sass = _sass(kernel.asm["cubin"])
    if not sass:
        return None
    loops = sorted(key_block_loops(sass), key=len)[:consumers]
    assert len(loops) == consumers and _local_accesses(loops) == 0, [len(b) for b in loops]
    return [_opcodes(body) for body in loops]


@pytest.mark.parametrize("d, causal", FP8_COMBOS)
def test_fp8_p_reaches_the_wgmma_without_byte_shuffles(d, causal):
    """fp8(P) is made where the P V wgmma reads it, one 32-bit register of the A operand per four
    keys of a row: in each consumer's key-block loop, F2FP converts two keys at a time and at
    most one PRMT a register joins two such halves (Br Bc / (128 * 4) = 16 registers); no SHF in
    the loop, and no LOP3 but the loop's own one. (With p.to(fp8) before the loop's back
    edge the d = 128 loop holds 112 PRMT, 65 LOP3 and 32 SHF.)"""
    sass = _sass(_compiled(torch.float8_e4m3fn, d, causal, "regs").asm["cubin"])
    if not sass:
        pytest.skip("needs cuobjdump")
    loops = key_block_loops(sass)
    assert len(loops) == 2, f"found {len(loops)} key-block loops for two consumers"
    registers = fa3.BLOCK_M * fa3.BLOCK_N // (128 * 4)
    for ops in map(_opcodes, loops):
        assert ops.count("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C") == 2 * registers, ops
        assert ops.count("PRMT") <= registers, f"{ops.count('PRMT')} PRMT in the loop"
        assert sum(op.startswith("LOP3") for op in ops) <= 1, "LOP3 in the loop"  # the loop's own: 0 or 1
        assert not any(op.startswith("SHF.") for op in ops), "SHF in the loop"


@pytest.mark.parametrize("d", [64, 128])
def test_fp8_conditional_rescaling_branches_over_the_rescale(d):
    """With rescale_threshold, each consumer has a branch that can jump over O's rescale and
    nothing else (in the key-block loop and before the last P V): two per consumer of the
    default build (fa3_fp8.config); the default build has none. (Which way the branch goes is
    the GPU test's to check.)"""
    conditional = _sass(_compiled(torch.float8_e4m3fn, d, False, "theta2").asm["cubin"])
    default = _sass(_compiled(torch.float8_e4m3fn, d, False, True).asm["cubin"])
    if not conditional:
        pytest.skip("needs cuobjdump")
    assert _skipped_rescales(conditional, d) == 2 * fa3_fp8.config(d)["CONSUMERS"]
    assert _skipped_rescales(default, d) == 0


@pytest.mark.parametrize("theta, want", [(None, (-1.0, 8.0)), (0, (0.0, 8.0)), (2, (2.0, 6.0)), (8.0, (8.0, 0.0))])
def test_fp8_rescale_threshold_sets_theta_and_shift(theta, want):
    """rescale_threshold theta: decide at theta, and P = 2^(8 - theta) exp2(S - m) <= 2^8."""
    got = fa3_fp8._rescaling(theta)
    assert (got["THETA"], got["SHIFT"]) == want


@pytest.mark.parametrize("theta", [-0.5, 8.5, True, "2", float("nan")])
def test_fp8_bad_rescale_threshold_names_the_argument(theta):
    x = torch.zeros(1, 1, 16, 64).to(torch.float8_e4m3fn)  # on the CPU: the argument is checked first
    with pytest.raises(ValueError, match=r"rescale_threshold must be None or a number in \[0, 8\]"):
        fa3_fp8.forward(x, x, x, False, rescale_threshold=theta)


@pytest.mark.parametrize("fraction", [-0.1, 1.5, True, "0.5", float("nan")])
def test_fp8_bad_poly_fraction_names_the_argument(fraction):
    x = torch.zeros(1, 1, 16, 64).to(torch.float8_e4m3fn)  # on the CPU: the argument is checked first
    with pytest.raises(ValueError, match=r"poly_fraction must be a number in \[0, 1\]"):
        fa3_fp8.forward(x, x, x, False, poly_fraction=fraction)


@pytest.mark.parametrize("d", [64, 128])
def test_fp8_three_consumers_compile_without_local_memory_in_their_loops(d):
    """consumers=3: three key-block loops, one per consumer, none touching local memory (S and O in
    160 registers, P in shared memory: four 16-byte stores a block of 128 keys), setmaxnreg
    raising two consumers to 160, and the three consumers' Q, O and P tiles beside the 3-stage
    ring in shared memory."""
    kernel = _compiled(torch.float8_e4m3fn, d, False, "consumers3")
    assert "setmaxnreg.inc.sync.aligned.u32 \t160;" in kernel.asm["ptx"]
    ring = 3 * 2 * fa3.BLOCK_N * d  # K and V^T, one byte an element
    tiles = 3 * (fa3.BLOCK_M * d + fa3.BLOCK_M * fa3.BLOCK_N + 2 * fa3.BLOCK_M * d)  # Q, P, O (bf16)
    assert ring + tiles <= kernel.metadata.shared <= ring + tiles + 2048
    loops = _p_from_shared_memory_loops(kernel, 3)
    if loops is None:
        pytest.skip("needs cuobjdump")
    for ops in loops:
        assert ops.count("STS.128") == fa3.BLOCK_M * fa3.BLOCK_N // (128 * 16), ops.count("STS.128")


def test_fp8_bad_consumers_names_the_argument():
    x = torch.zeros(1, 1, 16, 64).to(torch.float8_e4m3fn)  # on the CPU: the arguments are checked first
    for bad in (1, 4, True, "3"):
        with pytest.raises(ValueError, match=r"consumers must be None, 2 or 3; got"):
            fa3_fp8.forward(x, x, x, False, consumers=bad)
    with pytest.raises(ValueError, match=r"consumers=3 takes P through shared memory: p_smem must be None or True"):
        fa3_fp8.forward(x, x, x, False, consumers=3, p_smem=False)
    with pytest.raises(ValueError, match=r"consumers=3 runs without ping-pong and without stamps; got pingpong=True"):
        fa3_fp8.compile_sm90(128, consumers=3, pingpong=True)


@pytest.mark.parametrize("d", [64, 128])
def test_fp8_default_build_follows_consumers_then_p_smem(d):
    """With nothing asked, d's defaults (three consumers at d = 64, 256-key blocks at d = 128);
    p_smem given, two consumers; pingpong=True or stamps, two consumers (ping-pong's turns and
    the stamp slots are for two), and stamps also Bc = 128 unless p_smem is given."""
    build = fa3_fp8._build_config
    assert build(d, None, None, None, False) == fa3_fp8.config(d)
    assert build(d, None, None, None, False)["CONSUMERS"] == fa3_fp8.CONSUMERS[d]
    for p_smem in (False, True):
        c = build(d, p_smem, None, None, False)
        assert (c["CONSUMERS"], c["P_SMEM"], c["BLOCK_N"]) == (2, p_smem, 256 if p_smem else 128)
    c = build(d, None, None, True, False)
    assert (c["CONSUMERS"], c["P_SMEM"]) == (2, fa3_fp8.P_SMEM[d])
    assert build(d, None, None, None, True) == fa3_fp8.config(d, p_smem=False)
    assert build(d, True, None, None, True)["BLOCK_N"] == 256
    assert build(d, None, 3, None, False)["CONSUMERS"] == 3


def test_fp8_default_consumers_come_before_p_smem(monkeypatch):
    """Where d's defaults ask for both three consumers and 256-key blocks, three consumers win
    (they take P through shared memory at Bc = 128); a truthy pingpong asks for two."""
    monkeypatch.setitem(fa3_fp8.P_SMEM, 64, True)
    monkeypatch.setitem(fa3_fp8.CONSUMERS, 64, 3)
    c = fa3_fp8.config(64)
    assert (c["CONSUMERS"], c["BLOCK_N"], c["P_SMEM"]) == (3, 128, True)
    assert fa3_fp8._build_config(64, None, None, 1, False)["CONSUMERS"] == 2


def test_fp8_pingpong_build_takes_two_consumers_at_d64():
    """compile_sm90 goes through _build_config: pingpong=True at d = 64 (three consumers by
    default) builds two consumers, 12 warps, with the turn barriers."""
    k = _compiled(torch.float8_e4m3fn, 64, False, _switch_key(True, True))
    assert k.metadata.num_warps == 12
    assert {int(fa3.PRODUCER_REGS), int(fa3.CONSUMER_REGS)} <= _register_budgets(k.asm["ptx"])


@pytest.mark.parametrize("d, causal", L_MMA_BUILDS)
def test_fp8_l_mma_sums_the_rows_on_the_tensor_cores(d, causal):
    """l_mma=True on d's default build (256-key blocks at d = 128, three consumers at 64): beside
    each P V one more wgmma, m64n8k32 e4m3 (Bc / 32 instructions, at both of a consumer's P V
    sites), and the softmax's row sums gone from the key-block loops: at most 8 FADD a loop where
    the build without it has more than Bc / 2 (each thread sums 2 rows of Bc / 4 keys). The wait
    for S_j lets P V and L run on (DEPBAR 0x2, key_block_loops' marker); without the mask the
    loops touch no local memory."""
    c = fa3_fp8.config(d)
    kernel = _compiled(torch.float8_e4m3fn, d, causal, "lmma")
    plain = _compiled(torch.float8_e4m3fn, d, causal, True)
    sites = len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n8k32\.f32\.e4m3\.e4m3", kernel.asm["ptx"]))
    assert sites == 2 * c["CONSUMERS"] * c["BLOCK_N"] // 32, sites
    assert "m64n8k32" not in plain.asm["ptx"]
    sass, sass_plain = _sass(kernel.asm["cubin"]), _sass(plain.asm["cubin"])
    if not sass:
        pytest.skip("needs cuobjdump")
    loops = sorted(key_block_loops(sass, "DEPBAR.LE gsb0, 0x2"), key=len)[:c["CONSUMERS"]]
    before = sorted(key_block_loops(sass_plain), key=len)[:c["CONSUMERS"]]
    assert len(loops) == len(before) == c["CONSUMERS"], ([len(b) for b in loops], [len(b) for b in before])
    for ops, ops_plain in zip(map(_opcodes, loops), map(_opcodes, before)):
        fadd = sum(op.startswith("FADD") for op in ops)
        assert fadd <= 8 < c["BLOCK_N"] // 2 < sum(op.startswith("FADD") for op in ops_plain), fadd
        gmma = [sum(op.startswith("QGMMA") for op in x) for x in (ops, ops_plain)]
        assert gmma[0] == gmma[1] + c["BLOCK_N"] // 32, gmma
    if not causal:
        assert _local_accesses(loops) == 0


def test_fp8_l_mma_without_the_overlap_waits_for_all_three_products():
    """l_mma=True with overlap=False: both P V sites issue L beside P V, and every wait for the
    tensor cores is a full one (wait_group 0: S, P V and L done before the softmax)."""
    c = fa3_fp8.config(128)
    ptx = _compiled(torch.float8_e4m3fn, 128, False, "lmma-serial").asm["ptx"]
    assert len(re.findall(r"m64n8k32\.f32\.e4m3\.e4m3", ptx)) == 2 * c["CONSUMERS"] * c["BLOCK_N"] // 32
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)
    assert waits and set(waits) == {"0"}, waits


def test_fp8_l_mma_names_the_argument():
    x = torch.zeros(1, 1, 16, 64).to(torch.float8_e4m3fn)  # on the CPU: the argument is checked first
    with pytest.raises(TypeError, match=r"l_mma must be None, True or False; got 'yes'"):
        fa3_fp8.forward(x, x, x, False, l_mma="yes")
    with pytest.raises(ValueError, match=r"l_mma=True sums P from shared memory: it needs a build with P there"):
        fa3_fp8.compile_sm90(128, p_smem=False, l_mma=True)
    with pytest.raises(TypeError, match=r"l_mma must be None, True or False; got 1"):
        fa3_fp8.compile_sm90(128, l_mma=1)


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_fp8_bad_p_smem_names_the_argument(bad):
    x = torch.zeros(1, 1, 16, 64).to(torch.float8_e4m3fn)  # on the CPU: the argument is checked first
    with pytest.raises(TypeError, match=r"p_smem must be None, True or False; got"):
        fa3_fp8.forward(x, x, x, False, p_smem=bad)
    with pytest.raises(TypeError, match=r"p_smem must be None, True or False"):
        fa3_fp8.compile_sm90(128, p_smem=bad)


def test_software_exp_uses_the_triton_kernels_cubic():
    """The Gluon software exp2 (fa3._poly_exp2) takes fa4's minimax cubic, c0 = 1 and c1..c3."""
    from flashlab.kernels import fa4

    assert fa4.COEFFICIENTS[0] == 1.0
    assert (fa3._POLY_C1.value, fa3._POLY_C2.value, fa3._POLY_C3.value) == fa4.COEFFICIENTS[1:]


@pytest.mark.parametrize("d", [64, 128])
def test_fp8_software_exp_takes_exponentials_off_the_mufu(d):
    """poly_fraction = 1/2: the key-block loop of each consumer computes half of P's exp2 on the
    special-function unit (MUFU.EX2) and half with the cubic's three FFMAs each, and touches no
    local memory; the default build runs every exp2 on MUFU.EX2."""
    default = _sass(_compiled(torch.float8_e4m3fn, d, False, True).asm["cubin"])
    poly = _sass(_compiled(torch.float8_e4m3fn, d, False, "poly0.5").asm["cubin"])
    if not poly:
        pytest.skip("needs cuobjdump")
    scores = fa3.BLOCK_M * fa3_fp8.config(d)["BLOCK_N"] // 128  # P's elements per thread in one key block
    # one loop per consumer, the shortest (at Bc = 256 the tile loop around them can pass for one)
    n = fa3_fp8.config(d)["CONSUMERS"]
    consumers = [sorted(key_block_loops(sass), key=len)[:n] for sass in (default, poly)]
    assert list(map(len, consumers)) == [n, n]
    for loop_default, loop_poly in zip(*consumers, strict=True):
        ex2 = [sum(op.startswith("MUFU.EX2") for op in body) for body in (loop_default, loop_poly)]
        ffma = [sum(op.startswith("FFMA") for op in body) for body in (loop_default, loop_poly)]
        assert scores <= ex2[0] <= scores + 4, ex2  # P, and the few alpha = exp2(m - m_new)
        assert ex2[1] == ex2[0] - scores // 2, ex2
        assert ffma[1] >= ffma[0] + 3 * scores // 2, ffma
    assert not _local_accesses(consumers[1])


def test_fp8_v_layout_matches_the_key_order():
    """wgmma_v(v)[..., :, k] is v's key key_order[k] (zero past N_k), whatever v's strides; the
    order is _as_operand's: within 16 keys, column k = 8 c2 + 4 c1 + 2 c3 + c0 holds key
    c = 8 c3 + 4 c2 + 2 c1 + c0."""
    from flashlab.kernels.fa3_fp8 import key_order, wgmma_v

    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 3, 37, 64, generator=g).to(torch.float8_e4m3fn)
    order = key_order(48)
    assert order[:16].tolist() == [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    assert sorted(order.tolist()) == list(range(48))
    padded = torch.nn.functional.pad(v.view(torch.uint8), (0, 0, 0, 11))
    got = wgmma_v(v)
    assert got.shape == (2, 3, 64, 48) and got.is_contiguous() and got.dtype == v.dtype
    assert torch.equal(got.view(torch.uint8), padded[:, :, order].transpose(-2, -1))
    keys_contiguous = v.transpose(-2, -1).contiguous().transpose(-2, -1)
    assert torch.equal(wgmma_v(keys_contiguous).view(torch.uint8), got.view(torch.uint8))


def test_fp8_v_layout_for_p_through_shared_memory():
    """wgmma_v(v, shared_block=Bc) holds, within every Bc keys, key 8 g + 2 q + e at column
    (Bc / 4) q + 2 g + e (key_order(Bc, shared=True), _p_to_shared's order), zero past N_k, N_k
    rounded up to a multiple of Bc."""
    from flashlab.kernels.fa3_fp8 import key_order, wgmma_v

    order = key_order(256, shared=True)
    assert order[:4].tolist() == [0, 1, 8, 9] and order[64:66].tolist() == [2, 3]
    assert order[2 * 31 + 64 * 3 + 1].item() == 8 * 31 + 2 * 3 + 1
    assert sorted(order.tolist()) == list(range(256))
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 3, 300, 64, generator=g).to(torch.float8_e4m3fn)
    padded = torch.nn.functional.pad(v.view(torch.uint8), (0, 0, 0, 212))  # 512 keys
    got = wgmma_v(v, shared_block=256)
    assert got.shape == (2, 3, 64, 512) and got.is_contiguous()
    blocks = torch.cat([order, 256 + order])
    assert torch.equal(got.view(torch.uint8), padded[:, :, blocks].transpose(-2, -1))


@pytest.mark.parametrize("d, k_block", P_SMEM_BUILDS)
def test_fp8_p_through_shared_memory_compiles_to_wide_stores(d, k_block):
    """p_smem=True: each consumer's key-block loop stores P with eight 16-byte stores (Br Bc bytes
    / 128 threads / 16), reads it back only through the P V wgmma (its A operand a shared-memory
    descriptor, no registers), and touches no local memory; k_block = 128 (a descale per half
    block) adds a second row maximum's shuffles, nothing per score. Without the mask; the causal
    builds are not asserted here (at d = 128 the loop reads local memory three times). The two
    shortest loops are the consumers': at d = 64 the tile loop around them can pass for one."""
    from flashlab.kernels import fa3_fp8

    loops = _p_from_shared_memory_loops(_compiled(torch.float8_e4m3fn, d, False, f"psmem-{k_block}"), 2)
    if loops is None:
        pytest.skip("needs cuobjdump")
    for ops in loops:
        assert ops.count("STS.128") == fa3.BLOCK_M * fa3_fp8.P_SMEM_BLOCK_N // (128 * 16), ops.count("STS.128")
        assert ops.count("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C") == fa3.BLOCK_M * fa3_fp8.P_SMEM_BLOCK_N // 256


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(q_block=100), ["q_block", "multiple of 64", "100"]),
        (dict(k_block=64), ["k_block", "multiple of 128", "64"]),
        (dict(k_block=True), ["k_block", "True"]),
        (dict(v_block=128), ["v_block must be None", "128"]),
    ],
)
def test_fp8_bad_blocks_name_the_argument(kwargs, words):
    from flashlab.kernels import fa3_fp8

    x = torch.zeros(1, 2, 256, 64).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError) as info:
        fa3_fp8._check(x, x, x, kwargs.get("q_block"), kwargs.get("k_block"), kwargs.get("v_block"), torch.bfloat16)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: (torch.zeros(2, 4, 64, dtype=torch.bfloat16),) * 3, ["4-D", "(2, 4, 64)"]),
        (lambda: (torch.zeros(1, 2, 4, 64),) * 3, ["bfloat16 or float16", "torch.float32"]),
        (lambda: (torch.zeros(1, 2, 4, 96, dtype=torch.float16),) * 3, ["head dimension", "(64, 128, 256)", "96"]),
        (lambda: (torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16).transpose(1, 2),) * 3, ["contiguous"]),
        (lambda: (torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 4, 64, dtype=torch.float16),
                  torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16)), ["one dtype"]),
        (lambda: (torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16), torch.zeros(1, 3, 4, 64, dtype=torch.bfloat16),
                  torch.zeros(1, 3, 4, 64, dtype=torch.bfloat16)), ["agree in B, H and d", "(1, 3, 4, 64)"]),
        (lambda: (torch.zeros(1, 2, 0, 64, dtype=torch.bfloat16),) * 3, ["positive", "N_q = 0"]),
    ],
)
def test_bad_input_names_the_argument(make, words):
    with pytest.raises(ValueError) as info:
        fa3.fa3_forward(*make())
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"
    assert not fa3.supported(*make())


@pytest.mark.skipif(GPU, reason="a CPU-only check")
def test_cpu_tensors_are_refused():
    with pytest.raises(ValueError, match="CUDA device"):
        fa3.fa3_forward(*(torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16),) * 3)


# --------------------------------------------------------------- on a Hopper GPU
def _hopper() -> bool:
    return GPU and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (sm_90: H100, H200)")


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("case", experiment.CASES, ids=str)
def test_matches_float64_reference(case):
    row = experiment.check_case(*case)
    assert row["ok"], f"{case}: {row}"


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("case", experiment.CASES[1:3] + experiment.CASES[6:8], ids=str)
def test_the_other_pingpong_setting_matches_too(case):
    """Ping-pong the other way from each head dimension's default (fa3.SWITCHES)."""
    row = experiment.check_case(*case, pingpong=not fa3.switches(case[4])[0])
    assert row["ok"], f"{case}: {row}"


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("case", [c for c in experiment.CASES if c[4] == 64], ids=str)
def test_both_consumer_counts_at_d64_match(case, consumers):
    """d = 64, both switches off (fa3.SWITCHES), with two consumer warpgroups (fa3.CONSUMERS'
    default with the mask) and with three (its default without): against the float64 reference,
    and race-free."""
    row = experiment.check_case(*case, pingpong=False, overlap=False, consumers=consumers)
    assert row["ok"], f"{case}: {row}"
    race = experiment.race_check(d=64, causal=case[5], pingpong=False, overlap=False, consumers=consumers)
    assert race["identical"] and race["nan_overwritten"], race


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_three_consumers_across_tiles(causal):
    """Three consumer warpgroups with several tiles per program (360 tiles of 192 rows on at most
    132 SMs; causal, dealt in pairs): every tile against the float64 reference, and a NaN-filled
    output overwritten everywhere. The cases above give each program one tile; this one carries
    the ring, the Q slots and the three-way empty barriers from tile to tile, as three consumers
    run by default at d = 64 without the mask (fa3.CONSUMERS)."""
    B, H, n, d = 2, 30, 1152, 64
    n_tiles = -(-n // (3 * fa3.BLOCK_M)) * B * H
    programs, deal = fa3.programs(n_tiles, causal, torch.device("cuda"))
    assert n_tiles >= 2 * programs and deal == (2 if causal else 1)
    row = experiment.check_case(B, H, n, n, d, causal, torch.bfloat16, pingpong=False, overlap=False, consumers=3)
    assert row["ok"], row
    race = experiment.race_check(B=B, H=H, n=n, d=d, causal=causal, pingpong=False, overlap=False, consumers=3)
    assert race["ok"], race


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("d", fa3.HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_race_free(d, causal):
    row = experiment.race_check(d=d, causal=causal)
    assert row["identical"], "the same inputs gave different bits"
    assert row["nan_overwritten"], "some output element was never written"


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("n", [1152, 1280])
def test_causal_tiles_dealt_in_pairs_are_all_right(n):
    """Causal with enough tiles to deal them in pairs (DEAL = 2), an even and an odd number of
    tiles a head (9 and 10 of 128 rows): every tile matches the float64
    reference, and a NaN-filled output buffer is overwritten everywhere."""
    B, H, d = 2, 30, 64
    rows = fa3.consumer_count(d, *fa3.switches(d), True) * fa3.BLOCK_M
    n_tiles = -(-n // rows) * B * H
    assert fa3.programs(n_tiles, True, torch.device("cuda"))[1] == 2
    row = experiment.check_case(B, H, n, n, d, True, torch.bfloat16)
    assert row["ok"], row
    race = experiment.race_check(B=B, H=H, n=n, d=d, causal=True)
    assert race["ok"], race


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_lse_matches_flash_attention(causal):
    from flashlab.kernels import flash_attention

    g = torch.Generator(device="cpu").manual_seed(3)
    q, k, v = (torch.randn(2, 4, 1000, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(3))
    _, lse = fa3.fa3_forward(q, k, v, causal=causal)
    _, lse_ref = flash_attention(q, k, v, causal=causal, return_lse=True)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-4, atol=1e-4)
    _, lse2 = fa3.forward(q, k, v, causal)  # the backward's convention: log2 units
    torch.testing.assert_close(lse2 * fa3.LN2, lse, rtol=0, atol=0)


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("schedule", ["no_overlap", "no_warp_specialization"])
@pytest.mark.parametrize("case", experiment.SCHEDULE_CASES, ids=str)
def test_ablation_schedules_match_too(schedule, case):
    row = experiment.check_case(*case, schedule=schedule)
    assert row["ok"], f"{schedule} {case}: {row}"


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("schedule", ["no_overlap", "no_warp_specialization"])
def test_ablation_schedules_race_free(schedule):
    row = experiment.race_check(schedule=schedule)
    assert row["identical"] and row["nan_overwritten"], row


# --------------------------------------------------------------- the FP8 kernel on a Hopper GPU
@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("case", experiment.FP8_CASES, ids=str)
def test_fp8_matches_dequantised_reference(case):
    """RMSE against float64 attention of the dequantised inputs within 1.25x the Triton FP8
    kernel's on the same inputs; lse within 1e-3 relative, -inf where a row sees no key."""
    row = experiment.fp8_check_case(*case)
    assert row["ok"], f"{case}: {row}"


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("pingpong, overlap", [s for s in FP8_SWITCH_BUILDS if s != fa3_fp8.SWITCHES[128]])
@pytest.mark.parametrize("case", experiment.FP8_CASES, ids=str)
def test_fp8_other_switches_match_too(case, pingpong, overlap):
    """The FP8 kernel's settings of its two switches other than its default (fa3_fp8.SWITCHES):
    as test_fp8_matches_dequantised_reference, and race-free."""
    _fp8_matches_and_race_free(case, pingpong=pingpong, overlap=overlap)


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("case", [c for c in experiment.FP8_CASES if c[4] == 128], ids=str)
def test_fp8_p_through_shared_memory_matches_too(case):
    """p_smem=True (Bc = 256, P through shared memory, a K descale per 128 keys: both halves of a
    key block scaled apart): as test_fp8_matches_dequantised_reference, and race-free."""
    _fp8_matches_and_race_free(case, p_smem=True)


# FP8_CASES and four with more tiles than twice the SMs, so that programs carry their ring and
# barriers from one tile to the next (causal: tiles dealt in pairs)
FP8_MANY_TILE_CASES = experiment.FP8_CASES + [(2, 16, 2048, 2048, d, c) for d in (64, 128) for c in (False, True)]


def _fp8_race_free_at_size(case: tuple, rows_per_tile: int, **kernel) -> None:
    """The race check at ``case``'s size where its tiles of ``rows_per_tile`` query rows outnumber
    twice the SMs, else at fp8_race_check's own (one tile a program), for the FP8 kernel built
    with ``kernel``."""
    B, H, n_q, n_k, d, causal = case
    tiles = -(-n_q // rows_per_tile) * B * H
    if tiles >= 2 * torch.cuda.get_device_properties(0).multi_processor_count:
        race = experiment.fp8_race_check(B, H, n_q, d, causal, **kernel)
    else:
        race = experiment.fp8_race_check(d=d, causal=causal, **kernel)
    assert race["ok"], race


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("case", FP8_MANY_TILE_CASES, ids=str)
def test_fp8_three_consumers_match_too(case):
    """consumers=3 (P through shared memory at Bc = 128): as test_fp8_matches_dequantised_reference,
    and race-free; the last four cases (d = 64 and 128) have more tiles than twice the SMs, so
    programs carry their ring and barriers from one tile to the next (causal: tiles dealt in
    pairs), and so does the race check, run at their size."""
    row = experiment.fp8_check_case(*case, consumers=3)
    assert row["ok"], f"{case}: {row}"
    _fp8_race_free_at_size(case, 3 * fa3.BLOCK_M, consumers=3)


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("case", FP8_MANY_TILE_CASES, ids=str)
def test_fp8_row_sums_on_the_tensor_cores_match_too(case):
    """l_mma=True (l summed by the tensor cores from the e4m3 P that P V reads): as
    test_fp8_matches_dequantised_reference (its lse, that of the rounded P, allowed
    log2(1 + 2^-4 + N_k 2^-18) more), and race-free, on d's default build; the last four cases
    carry the ring and the ones tile from tile to tile, and their race check runs at their size.
    Its output stays within 2 % of O's RMS of the build that sums l in the softmax, and its lse
    within log2(1 + 2^-4 + N_k 2^-18) + 1e-3 of that build's (log2 units:
    each P rounds by at most 2^-4 of itself, or half e4m3's subnormal step, 2^-10 / 2^8, against
    l >= 1)."""
    B, H, n_q, n_k, d, causal = case
    row = experiment.fp8_check_case(*case, l_mma=True)
    assert row["ok"], f"{case}: {row}"
    c = fa3_fp8.config(d)
    _fp8_race_free_at_size(case, c["CONSUMERS"] * c["BLOCK_M"], l_mma=True)
    pre = experiment._fp8_inputs(B, H, n_q, n_k, d, 0)
    o1, l1 = fa3_fp8.forward(**pre, causal=causal, l_mma=False)
    o2, l2 = fa3_fp8.forward(**pre, causal=causal, l_mma=True)
    rms = o1.double().pow(2).mean().sqrt()
    assert (o1.double() - o2.double()).pow(2).mean().sqrt() <= 0.02 * rms
    finite = torch.isfinite(l1)
    bound = math.log2(1 + 2.0**-4 + n_k * 2.0**-18) + 1e-3
    assert torch.equal(finite, torch.isfinite(l2)) and (l1[finite] - l2[finite]).abs().max() <= bound


def _fp8_matches_and_race_free(case: tuple, **kernel) -> None:
    """fp8_check_case's bounds at ``case``, and the race check at its d and mask, for the FP8
    kernel built with ``kernel`` (forward's keyword arguments)."""
    row = experiment.fp8_check_case(*case, **kernel)
    assert row["ok"], f"{case}: {row}"
    race = experiment.fp8_race_check(d=case[4], causal=case[5], **kernel)
    assert race["ok"], race


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("poly_fraction", [0.25, 1.0])
@pytest.mark.parametrize("case", experiment.FP8_CASES, ids=str)
def test_fp8_software_exp_matches(case, poly_fraction):
    """P's exp2 in software on a quarter of its columns, and on all of them: as
    test_fp8_matches_dequantised_reference (the cubic's error, below 1e-4 relative, is far under
    e4m3's rounding of P), and race-free."""
    _fp8_matches_and_race_free(case, poly_fraction=poly_fraction)


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("staircase", [0.0, 0.75])
@pytest.mark.parametrize("case", experiment.FP8_CASES, ids=str)
def test_fp8_conditional_rescaling_matches(case, staircase):
    """rescale_threshold = 2 within 1.1x the RMSE of the kernel's arithmetic emulated in float64
    (experiment.fp8_emulated_rmse: the same rule for m, P rounded to e4m3 at the same scale),
    lse as test_fp8_matches_dequantised_reference, and race-free; the kernel rescaling at every
    block within 1.1x its own emulation on the same inputs. With the staircase every row's block
    maxima climb 0.75 a block, so a warpgroup keeps a stale maximum for two blocks in three, at a
    distance up to 2: an O not rescaled when m moves, or a P allowed past 2^8 (e4m3 clips it at
    448), fails here. Against the kernel rescaling at every block conditional rescaling loses
    up to 2x in RMSE on these inputs, and the emulation loses the same (likely because a stale m
    rounds each block's largest P, which a fresh m makes exactly 2^8)."""
    row = experiment.fp8_check_case(*case, rescale_threshold=2, staircase=staircase)
    plain = experiment.fp8_check_case(*case, staircase=staircase)
    assert row["ok"], f"{case}: {row}"
    assert float(plain["rmse"]) <= 1.1 * float(plain["rmse_emulated"]) + 1e-5, plain
    race = experiment.fp8_race_check(d=case[4], causal=case[5], rescale_threshold=2)
    assert race["ok"], race


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("n_q", [100, 50])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_conditional_rescaling_keeps_heads_apart(causal, n_q):
    """rescale_threshold = 2: head 0 of a two-head call is bit-identical to head 0 run alone.
    With N_q = 100 the last warpgroup of head 0's tile holds rows 64-99 and, past N_q, head 1's
    first 28 queries (Q is read as one (B H N_q, d) matrix); run alone, those rows are zeros.
    Only rows below N_q may vote on moving m: in a float64 emulation of the rule that let all 64
    rows vote, head 0's outputs move by up to 6.6e-3 on these inputs. N_q = 50 leaves the second
    warpgroup with no row of head 0 at all."""
    pre = experiment._fp8_inputs(1, 2, n_q, 1000, 128, 0)
    alone = {name: x[:, :1].contiguous() if torch.is_tensor(x) else x for name, x in pre.items()}
    o, lse = fa3_fp8.forward(**pre, causal=causal, rescale_threshold=2)
    o1, lse1 = fa3_fp8.forward(**alone, causal=causal, rescale_threshold=2)
    assert torch.isfinite(o).all() and torch.equal(o[:, :1], o1) and torch.equal(lse[:, :1], lse1)


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("d", fa3_fp8.HEAD_DIMS)
def test_fp8_race_free(d):
    row = experiment.fp8_race_check(d=d)
    assert row["identical"], "the same inputs gave different bits"
    assert row["nan_overwritten"], "some output element was never written"


@pytest.mark.gpu
@needs_gpu
@needs_hopper
def test_fp8_rmse_below_the_per_tensor_baseline():
    """On outlier inputs, per-block scaling (Q, K per 128 rows, V per head) gives a lower RMSE than
    per-tensor scaling (the baseline), on average over the seeds, and so does Hadamard on top."""
    rows = experiment.fp8_rmse(seeds=(0, 1, 2))
    mean = lambda m: sum(r["rmse"] for r in rows if r["method"] == m) / 3  # noqa: E731
    baseline = mean("fp8 per-tensor (baseline, triton)")
    assert mean("gluon fp8 per-tensor") == pytest.approx(baseline, rel=0.05)
    assert mean("gluon fp8 per-block, V per head") < baseline
    assert mean("gluon fp8 per-block + hadamard, V per head") < mean("gluon fp8 per-block, V per head")


@pytest.mark.gpu
@needs_gpu
@needs_hopper
def test_fp8_impl_gluon_through_the_public_entry_point():
    from flashlab.kernels.fp8 import flash_attention_fp8, flash_attention_fp8_from, quantize_qkv

    g = torch.Generator(device="cpu").manual_seed(5)
    q, k, v = (torch.randn(1, 2, 512, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    pre = quantize_qkv(q, k, v, block=128, v_block=None)
    o_gluon = flash_attention_fp8(**pre, impl="gluon")
    o_triton = flash_attention_fp8(**pre)
    assert (o_gluon.float() - o_triton.float()).abs().max().item() < 2e-2
    o_from = flash_attention_fp8_from(q, k, v, block=128, v_block=None, impl="gluon")
    torch.testing.assert_close(o_from, o_gluon, rtol=0, atol=0)
    with pytest.raises(ValueError, match="impl"):
        flash_attention_fp8(**pre, impl="cutlass")


# --------------------------------------------------------------- the time stamps, on the GPU
def _every_stamp_taken(stamps: torch.Tensor, n_blocks: int) -> list[dict[str, object]]:
    """The phases of a stamped tile of ``n_blocks`` key blocks (fa3_timeline.phases, which raises
    if a stamp is missing), after checking that each partition has one row per step of its
    program order and that the SM's clock never goes back along it."""
    from flashlab.lab.experiments import fa3_timeline as timeline

    rows = timeline.phases(stamps)
    for part in fa3.STAMP_PARTS:
        mine = [r for r in rows if r["partition"] == part]
        assert len(mine) == len(timeline.program_order(n_blocks, fa3.STAMP_PARTS.index(part))) - 1
        assert all(r["end_us"] >= r["start_us"] for r in mine), f"{part}: a phase ends before it starts"
    return rows


@pytest.mark.gpu
@needs_gpu
@needs_hopper
def test_time_stamps_show_the_pingpong():
    """One stamped tile (the middle program) of 16 key blocks: the result is the unstamped
    kernel's, bit for bit; every partition took every stamp and, in the order the kernel runs its
    phases, the SM's clock never goes back; the consumers' softmax phases alternate, and while one
    is in its softmax the other has a GEMM of S in flight (ping-pong)."""
    from flashlab.lab.experiments import fa3_timeline as timeline

    g = torch.Generator(device="cpu").manual_seed(6)
    q, k, v = (torch.randn(2, 4, 2048, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    o, lse2, stamps = timeline.stamped_forward(q, k, v, at=(3, 4))
    o_plain, lse_plain = fa3.forward(q, k, v, False)
    assert torch.equal(o, o_plain) and torch.equal(lse2, lse_plain), "the stamps changed the result"
    rows = _every_stamp_taken(stamps, 16)
    checks = timeline.interleaving(rows)
    assert checks["softmax_alternation"] >= 0.8, checks
    assert checks["softmax_under_other_gemm"] >= 0.8, checks


@pytest.mark.gpu
@needs_gpu
@needs_hopper
@pytest.mark.parametrize("p_smem", [False, True])
def test_fp8_time_stamps_take_every_phase(p_smem):
    """The FP8 kernel stamped on one tile (the middle program) of 2048 keys (16 blocks of 128, or
    8 of 256 with p_smem): the result is the unstamped kernel's at the same tile, bit for bit;
    every partition took every stamp, and in the order the
    kernel runs its phases the SM's clock never goes back. (Its default runs without ping-pong,
    so the consumers' softmaxes are not required to alternate.)"""
    from flashlab.kernels.fp8 import quantize_qkv
    from flashlab.lab.experiments import fa3_timeline as timeline

    g = torch.Generator(device="cpu").manual_seed(6)
    q, k, v = (torch.randn(2, 4, 2048, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    pre = quantize_qkv(q, k, v, block=128, v_block=None)
    o, lse2, stamps = timeline.stamped_fp8_forward(pre, at=(3, 4), p_smem=p_smem)
    o_plain, lse_plain = fa3_fp8.forward(**pre, causal=False, p_smem=p_smem)  # the stamped build's tile
    assert torch.equal(o, o_plain) and torch.equal(lse2, lse_plain), "the stamps changed the result"
    rows = _every_stamp_taken(stamps, 8 if p_smem else 16)
