"""A discrete-event model of one Hopper SM running the FlashAttention forward loop.

FlashAttention-3 (Shah et al., 2024, §3) keeps three units of an SM busy at once:

    tma     the load engine (TMA) that copies K_j, V_j from memory into shared memory
    tensor  the tensor core, running the two GEMMs   S_j = Q K_j^T   and   O += P_j V_j
    mufu    the exp unit (MUFU) that evaluates       P_j = exp(S_j - m)

A *task* occupies one resource for a fixed number of cycles and may start only after
the tasks it depends on have finished. The engine below is greedy list scheduling:
at every moment, each free resource starts the first ready task in issue order. The
schedules of the chapter differ only in their dependency edges:

    serial              one warpgroup loads, computes S, softmax, PV, in turn (FA2 style)
    producer_consumer   a producer fills a k-slot ring buffer, a consumer computes (§3.1)
    pingpong            two consumer warpgroups alternate on the tensor core (§3.1, Fig. 1)
    intra_warpgroup     S_{j+1} = Q K_{j+1}^T is issued before softmax_j finishes (§3.2, Alg. 2)
    pingpong_intra      both of the above (the full FA3 schedule)

Durations come from :mod:`flashlab.hardware` for a tile (Br, Bc, d); see :class:`Tile`.

Glossary: Br, Bc = rows of the Q tile and of the K/V tile (块大小); d = head dimension;
G0_j = the GEMM S_j = Q K_j^T; G1_j = the GEMM O += P_j V_j; warpgroup = 4 warps that
issue one WGMMA together (线程束组); ring buffer = k shared-memory slots reused in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hardware import H100, GPU

__all__ = ["RESOURCES", "Tile", "Task", "Event", "Timeline", "Schedule", "simulate",
           "serial", "producer_consumer", "pingpong", "intra_warpgroup", "pingpong_intra", "SCHEDULES"]

RESOURCES = ("tma", "tensor", "mufu")


@dataclass(frozen=True)
class Tile:
    """One step of the attention loop and the cycles each task of it takes on one SM.

    load_bytes_per_cycle is an assumption, not a datasheet number: each K/V tile is
    re-read by every query tile of its head, so it mostly comes from L2, which is
    faster than the per-SM share of HBM bandwidth (3.35e12 / (132 x 1.83e9) = 13.9
    B/cycle on H100). We take 32 B/cycle; :meth:`hbm_share` gives the HBM figure.
    """

    Br: int = 128
    Bc: int = 128
    d: int = 128
    gpu: GPU = H100
    bytes_per_element: int = 2
    load_bytes_per_cycle: float = 32.0

    @property
    def gemm_cycles(self) -> float:
        """One GEMM of a (Br, d) x (d, Bc) product: 2 Br Bc d FLOPs / MMA FLOPs per cycle."""
        return 2 * self.Br * self.Bc * self.d / self.gpu.mma_flops_per_cycle

    @property
    def softmax_cycles(self) -> float:
        """Br Bc exponentials / exps per cycle (only the exps: MUFU is the slow part)."""
        return self.Br * self.Bc / self.gpu.mufu_exp_per_cycle

    @property
    def load_cycles(self) -> float:
        """K_j and V_j, each (Bc, d): 2 Bc d elements at load_bytes_per_cycle."""
        return 2 * self.Bc * self.d * self.bytes_per_element / self.load_bytes_per_cycle

    def hbm_share(self) -> float:
        """Bytes per cycle per SM if every SM drew an equal share of HBM bandwidth."""
        return self.gpu.hbm_bandwidth / (self.gpu.sm_count * self.gpu.clock_hz)


@dataclass(frozen=True)
class Task:
    """``name`` runs on ``resource`` for ``duration`` cycles after all of ``deps``.
    ``owner`` (e.g. "WG1") and ``kind`` ("load", "G0", "softmax", "G1") label plots."""

    name: str
    resource: str
    duration: float
    deps: tuple[str, ...] = ()
    owner: str = ""
    kind: str = ""


@dataclass(frozen=True)
class Event:
    """What the timeline records: ``task`` held ``resource`` from ``start`` to ``end``."""

    resource: str
    task: str
    start: float
    end: float
    owner: str = ""
    kind: str = ""


@dataclass(frozen=True)
class Timeline:
    """The result of :func:`simulate`: every task's event, in start order."""

    events: tuple[Event, ...]

    @property
    def makespan(self) -> float:
        """Cycles from the first start to the last end."""
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def busy(self, resource: str) -> float:
        """Cycles ``resource`` spent working (no two of its events overlap)."""
        return sum(e.end - e.start for e in self.events if e.resource == resource)

    def utilisation(self, resource: str = "tensor") -> float:
        """Fraction of the makespan ``resource`` was busy."""
        return self.busy(resource) / self.makespan

    def rows(self) -> list[tuple[str, str, float, float]]:
        """(resource, task, start, end) tuples."""
        return [(e.resource, e.task, e.start, e.end) for e in self.events]


def simulate(tasks: list[Task]) -> Timeline:
    """Greedy list scheduling: a task starts at the first moment its dependencies are
    done and its resource is free; ties go to the task issued first (earlier in ``tasks``)."""
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"task names must be unique; got duplicates in {names}")
    for t in tasks:
        if t.resource not in RESOURCES:
            raise ValueError(f"task {t.name!r}: resource must be one of {RESOURCES}; got {t.resource!r}")
        if t.duration < 0:
            raise ValueError(f"task {t.name!r}: duration must be >= 0; got {t.duration}")
        unknown = [d for d in t.deps if d not in names]
        if unknown:
            raise ValueError(f"task {t.name!r}: deps must name tasks of the schedule; got unknown {unknown}")
    end: dict[str, float] = {}                    # finish time of every started task
    free_at = {r: 0.0 for r in RESOURCES}         # when each resource next becomes free
    pending, events, now = list(tasks), [], 0.0
    while pending:
        started = True
        while started:                            # rescan: a 0-cycle task may free others now
            started = False
            for t in list(pending):               # issue order = priority
                ready = all(d in end and end[d] <= now for d in t.deps)
                if ready and free_at[t.resource] <= now:
                    end[t.name] = free_at[t.resource] = now + t.duration
                    events.append(Event(t.resource, t.name, now, now + t.duration, t.owner, t.kind))
                    pending.remove(t)
                    started = True
        future = [x for x in [*end.values(), *free_at.values()] if x > now]
        if pending and not future:
            raise ValueError(f"deadlock: {[t.name for t in pending]} wait on each other (a dependency cycle)")
        now = min(future, default=now)
    return Timeline(tuple(sorted(events, key=lambda e: (e.start, e.resource))))


@dataclass(frozen=True)
class Schedule:
    """A named task list; ``slots`` maps K/V block j to (its load, the tasks that free
    its ring-buffer slot), so tests can check the buffer never holds more than ``stages``."""

    name: str
    tasks: tuple[Task, ...]
    stages: int
    slots: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def run(self) -> Timeline:
        """Simulate the schedule (see :func:`simulate`)."""
        return simulate(list(self.tasks))

    def ring_occupancy(self, timeline: Timeline) -> int:
        """Most ring-buffer slots held at once: slot j is held from the start of its
        load to the end of the last task that reads it."""
        when = {e.task: e for e in timeline.events}
        spans = [(when[load].start, max(when[r].end for r in release)) for load, release in self.slots.values()]
        return max(sum(s <= t < e for s, e in spans) for t, _ in spans)


def _build(name: str, tile: Tile, n_blocks: int, consumers: int, stages: int,
           intra: bool, producer: bool, barrier: bool) -> Schedule:
    """The one builder behind every schedule; the flags switch FA3's ideas on."""
    if n_blocks < 1 or stages < 1:
        raise ValueError(f"n_blocks and stages must be >= 1; got n_blocks={n_blocks}, stages={stages}")
    wgs = [f"WG{c + 1}" for c in range(consumers)]
    tasks: list[Task] = []
    slots: dict[int, tuple[str, tuple[str, ...]]] = {}
    for j in range(n_blocks):
        release = tuple(f"{w}.G1_{j}" for w in wgs)           # last readers of slot j
        if producer:                                          # ring buffer: wait for slot j - stages
            load_deps = slots[j - stages][1] if j >= stages else ()
        else:                                                 # the consumer loads itself, after block j-1
            load_deps = (f"{wgs[0]}.G1_{j - 1}",) if j else ()
        tasks.append(Task(f"load_{j}", "tma", tile.load_cycles, load_deps, "producer", "load"))
        slots[j] = (f"load_{j}", release)
        for c, w in enumerate(wgs):
            def prev(kind: str, w: str = w, j: int = j) -> tuple[str, ...]:  # same warpgroup, block j-1
                return (f"{w}.{kind}_{j - 1}",) if j else ()
            if intra:   # Alg. 2: S_j = Q K_j^T issued once softmax_{j-1} is done, before G1_{j-1}
                g0_deps = (f"load_{j}", *prev("softmax"))
            else:       # in order: S_j after O += P_{j-1} V_{j-1}
                g0_deps = (f"load_{j}", *prev("G1"))
            if barrier and c:   # named barrier: WG2's GEMMs go after WG1's (§3.1)
                g0_deps += (f"{wgs[c - 1]}.G0_{j}",)
            tasks.append(Task(f"{w}.G0_{j}", "tensor", tile.gemm_cycles, g0_deps, w, "G0"))
            tasks.append(Task(f"{w}.softmax_{j}", "mufu", tile.softmax_cycles,
                              (f"{w}.G0_{j}", *prev("softmax")), w, "softmax"))
            tasks.append(Task(f"{w}.G1_{j}", "tensor", tile.gemm_cycles,
                              (f"{w}.softmax_{j}", *prev("G1")), w, "G1"))
    if intra:   # issue order of Alg. 2: G0_{j+1} ahead of G1_j on the tensor core
        order = {t.name: i for i, t in enumerate(tasks)}
        for t in tasks:
            if t.kind == "G1":
                j = int(t.name.rsplit("_", 1)[1])
                if j + 1 < n_blocks:
                    order[t.name] = order[f"{t.owner}.G0_{j + 1}"] + 0.5
        tasks.sort(key=lambda t: order[t.name])
    return Schedule(name, tuple(tasks), stages if producer else 1, slots)


def serial(tile: Tile = Tile(), n_blocks: int = 8) -> Schedule:
    """(a) FA2 style: one warpgroup loads K_j, V_j, then S, softmax, PV, with no overlap."""
    return _build("serial", tile, n_blocks, 1, 1, intra=False, producer=False, barrier=False)


def producer_consumer(tile: Tile = Tile(), n_blocks: int = 8, stages: int = 3) -> Schedule:
    """(b) Warp specialisation: a producer fills a ``stages``-slot ring buffer ahead of one consumer."""
    return _build(f"producer_consumer({stages})", tile, n_blocks, 1, stages, False, True, False)


def pingpong(tile: Tile = Tile(), n_blocks: int = 8, stages: int = 3) -> Schedule:
    """(c) Two consumer warpgroups, each with its own Q tile, share K_j, V_j and alternate GEMMs."""
    return _build("pingpong", tile, n_blocks, 2, stages, False, True, True)


def intra_warpgroup(tile: Tile = Tile(), n_blocks: int = 8, stages: int = 3) -> Schedule:
    """(d) One consumer that issues S_{j+1} = Q K_{j+1}^T before the softmax of block j is used."""
    return _build("intra_warpgroup", tile, n_blocks, 1, stages, True, True, False)


def pingpong_intra(tile: Tile = Tile(), n_blocks: int = 8, stages: int = 3) -> Schedule:
    """(e) Ping-pong between two consumers, each pipelined inside (FA3's full schedule)."""
    return _build("pingpong_intra", tile, n_blocks, 2, stages, True, True, True)


SCHEDULES = {"serial": serial, "producer_consumer": producer_consumer, "pingpong": pingpong,
             "intra_warpgroup": intra_warpgroup, "pingpong_intra": pingpong_intra}
