"""One submission being graded: its kernel in a sandbox, and the checks outside it.

The student's cells (the prose of the chapter, their answers, any cell they added)
run in a Jupyter kernel inside the sandbox (:mod:`.sandbox`). The tests cells do
**not**: the grader runs the book's tests cells itself, in :class:`Checker`, a
namespace of the grader's own process with the grader's NumPy and the package as
installed. There every function an exercise asks for (``update_row``, ...) is a
:class:`RemoteFunction`: calling it sends the arguments into the kernel as data,
runs the student's function there and brings back what it returned, as data
(:mod:`.codec`). So nothing a submission does inside its kernel (patching NumPy,
an IPython input transformer, a hook, a value whose ``__eq__`` lies, a tests cell
rewritten on disk) reaches the checks: they see numbers.

The package functions an exercise asks the student to write themselves
(:data:`FORBIDDEN`) are not in the kernel at all: the sandbox's package copy holds
stubs that ask the grader to run them (:mod:`.served`). The grader answers while the
chapter's cells run and refuses every one of them while any exercise's tests call the
student's code, so such a call raises, whoever makes it.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import codec, sandbox, served
from .notebook import BEGIN_HIDDEN, END_HIDDEN

REPLY_MIME = "application/x-flashlab-reply"
#: Text kept of one cell's output (stdout, stderr, results); the rest is dropped.
OUTPUT_CAP = 200_000
#: The largest message (bytes) the grader takes from a kernel; a kernel that sends a larger one
#: is disconnected, and its cell runs out of time.
MAX_MESSAGE = 160 << 20
#: The largest result (bytes of encoded data) a student's function may return to the tests: an
#: exercise's answer is a few arrays of test size, and a larger one (a tuple of millions of
#: strings) would cost the grader's process gigabytes once decoded.
MAX_RESULT = 16 << 20
#: Seconds a kernel gets to start, to answer an interrupt, to shut down.
START_TIMEOUT_S = 120.0
INTERRUPT_GRACE_S = 5.0

#: Package functions each exercise asks the student to write ("module:qualname"). The
#: grader holds all of them (and :data:`ALSO_HELD`) and refuses every one while any
#: exercise's tests call the student's code; this table says which exercise each is for.
FORBIDDEN: dict[str, tuple[str, ...]] = {}
_SOFTMAX = ("flashlab.reference.softmax:softmax", "flashlab.reference.softmax:online_softmax",
            "flashlab.reference.softmax:OnlineSoftmaxState.update",
            "flashlab.reference.softmax:OnlineSoftmaxState.merge")
_FLASH1 = ("flashlab.reference.flash1:flash1_step", "flashlab.reference.flash1:flash1_forward",
           "flashlab.reference.flash1:flash1_backward", "flashlab.reference.flash1:block_sizes",
           "flashlab.reference.flash1:flash1_flops", "flashlab.reference.naive:attention_backward",
           "flashlab.reference.softmax:OnlineSoftmaxState.update")
#: The chapter-6 simulator's schedules, its builder and its engine (exercises that ask for a schedule).
_SCHEDULES = tuple(f"flashlab.sim.events:{name}" for name in (
    "_build", "serial", "producer_consumer", "pingpong", "intra_warpgroup", "pingpong_intra", "simulate",
    "Schedule.run"))
for _name in ("ch02-ex1", "ch02-ex2", "ch02-ex3", "ch02-ex4"):  # combine: a log-sum-exp and a merge
    FORBIDDEN[_name] = _SOFTMAX + ("flashlab.reference.beyond:combine",)
for _name in ("ch03-ex1", "ch03-ex2", "ch03-ex3", "ch03-ex4"):
    FORBIDDEN[_name] = _FLASH1
# ch03-ex1 merges a stored (O, L) state with a tile's: the package's merges are off too
FORBIDDEN["ch03-ex1"] = _FLASH1 + ("flashlab.reference.softmax:OnlineSoftmaxState.merge",
                                   "flashlab.reference.beyond:combine",
                                   "flashlab.reference.flash2:flash2_forward")
FORBIDDEN.update({
    "ch04-ex1": ("flashlab.memory:count_flash", "flashlab.reference.flash1:block_sizes"),
    "ch04-ex3": ("flashlab.memory:count_flash", "flashlab.reference.flash1:block_sizes",
                 "flashlab.memory:fa2_order_io"),
    "ch05-ex1": ("flashlab.reference.flash2:flash2_forward", "flashlab.reference.softmax:OnlineSoftmaxState.update",
                 "flashlab.reference.naive:attention"),
    "ch05-ex2": ("flashlab.sim.occupancy:schedule", "flashlab.sim.occupancy:programs"),
    "ch05-ex3": ("flashlab.reference.flash2:flash2_backward", "flashlab.reference.naive:attention_backward"),
    "ch05-ex4": ("flashlab.sim.occupancy:warp_exchange", "flashlab.sim.occupancy:operand_reads"),
    "ch06-ex1": _SCHEDULES,
    "ch06-ex2": ("flashlab.reference.fp8:hadamard_transform",
                 "flashlab.reference.fp8:RandomOrthogonal.__call__"),
    "ch06-ex3": ("flashlab.reference.fp8:quantize",),
    "ch06-ex4": _SCHEDULES,
    "ch07-ex1": ("flashlab.cycles:forward_tile_cycles", "flashlab.cycles:forward_matmuls",
                 "flashlab.cycles:_cycles"),
    "ch07-ex2": ("flashlab.reference.softexp:exp2", "flashlab.reference.softexp:range_reduce",
                 "flashlab.reference.softexp:horner", "flashlab.reference.softexp:insert_exponent"),
    "ch07-ex3": ("flashlab.reference.rescale:rescales",),
    "ch08-ex3": _SOFTMAX,
    "ch09-ex1": ("flashlab.reference.beyond:combine", "flashlab.reference.softmax:OnlineSoftmaxState.merge"),
    "ch09-ex2": ("flashlab.reference.beyond:causal_block_counts",),
    "ch09-ex3": ("flashlab.reference.beyond:kv_cache_bytes",),
    "ch10-ex1": ("flashlab.reference.beyond:combine", "flashlab.reference.softmax:OnlineSoftmaxState.merge"),
    "ch10-ex2": ("flashlab.parallel.model:ring_step_bytes",),
    "ch10-ex3": ("flashlab.reference.ring:shard_positions", "flashlab.reference.ring:shard",
                 "flashlab.reference.ring:ring_work"),
})


#: Package functions held besides those an exercise names (:data:`FORBIDDEN`): the ones
#: that compute an exercise's answer by another route (attention with a mask, a window, a
#: ring; the tile steps the operation counter repeats; the tile counts that causal and
#: windowed counts are special cases of). Every held function is refused while any
#: exercise's tests call the student's code.
ALSO_HELD: tuple[str, ...] = tuple(
    f"flashlab.{module}:{name}" for module, names in {
        "reference.naive": ("scores", "attention_flops"),
        "reference.softmax": ("naive_softmax", "online_attention"),
        "reference.rescale": ("trace_row", "running_max_changes", "staircase_row", "conditional_attention",
                              "attention"),
        "reference.counting": ("_v1_tile", "_v2_tile", "_v2_finish", "_v1_backward_P", "_v2_backward_P"),
        "reference.beyond": ("_masked_attention", "_gqa_attention", "attention_gqa", "window_block_counts",
                             "attention_window", "attention_varlen", "decode_split_kv", "attention_paged"),
        "reference.flash1": ("flash1_block_counts",),
        "reference.fp8": ("fp8_attention",),
        "reference.ring": ("ring_attention", "ring_attention_backward"),
        "memory": ("simulate_flash", "simulate_standard", "count_standard", "_flash", "_standard"),
        "cycles": ("backward_matmuls", "backward_tile_cycles", "exp_split_cycles"),
        "parallel.model": ("ring_step_flops", "ring_step_time", "hiding_length"),
    }.items() for name in names)


#: Held functions an exercise's answer may still use (through the package function it is
#: meant to call: ch04-ex2 compares the chapter's IO formulas, and flash_io_formula sizes its
#: blocks with block_sizes).
STILL_SERVED: dict[str, tuple[str, ...]] = {
    "ch04-ex2": ("flashlab.reference.flash1:block_sizes",),
}


def held_specs(forbidden: Mapping[str, Sequence[str]]) -> frozenset[str]:
    """Every package function the grader holds: those some exercise of ``forbidden``
    switches off, and :data:`ALSO_HELD`."""
    return frozenset(spec for specs in forbidden.values() for spec in specs) | frozenset(ALSO_HELD)


class KernelDied(RuntimeError):
    """The student's kernel exited (or was stopped) before answering."""


class RemoteError(RuntimeError):
    """The student's kernel answered a call with something that is not a result."""


@dataclass(frozen=True)
class Outcome:
    """What running one cell did: ``ok`` or the exception's name and first line.

    ``check`` says, for a tests cell that raised, where: ``"visible"`` (a check the
    student sees), ``"hidden"`` (between the hidden-tests markers) or ``""`` (unknown).
    """

    ok: bool
    ename: str = ""
    evalue: str = ""
    check: str = ""

    @property
    def line(self) -> str:
        first = (self.evalue.strip().splitlines() or [""])[0]
        if first.startswith("(line "):
            return f"{self.ename} {first}"
        return f"{self.ename}: {first}" if first else self.ename


@dataclass
class _Run:
    outcome: Outcome
    outputs: list = field(default_factory=list)
    replies: list = field(default_factory=list)


def _source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


_AGENT = r'''
def _flashlab_install(codec_src, probes_src):
    import json, sys, types
    import numpy as np
    from IPython import get_ipython
    from IPython.display import publish_display_data

    def module(name, src):
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        exec(compile(src, "<" + name + ">", "exec"), mod.__dict__)
        return mod

    codec = module("_flashlab_codec", codec_src)

    class Agent:
        def call(self, text):
            try:
                request = codec.loads(text, objects=True)
                namespace = get_ipython().user_ns
                if request["name"] not in namespace:
                    raise NameError("name " + repr(request["name"]) + " is not defined")
                fn = namespace[request["name"]]
                with np.errstate(**request["errstate"]):
                    if request["probe"]:  # a fresh copy of the probes for every call
                        fresh = {"__name__": "_flashlab_probes"}
                        exec(compile(probes_src, "<_flashlab_probes>", "exec"), fresh)
                        value = fresh[request["probe"]](fn, *request["args"], **request["kwargs"])
                    else:
                        value = fn(*request["args"], **request["kwargs"])
                reply = codec.dumps({"ok": value})
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                reply = codec.dumps({"raised": (type(exc).__name__, str(exc)[:2000])})
            publish_display_data({"''' + REPLY_MIME + r'''": reply})

    get_ipython().user_ns["__flashlab__"] = Agent()
'''


class KernelSession:
    """The kernel of one notebook being graded, in its sandbox (or not, in unsafe mode).

    Parameters
    ----------
    site : Path or None
        The package copy made by :func:`.sandbox.package_copy` (shared by every sandbox).
    notebook : Path or None
        The submitted notebook, shown read-only in the kernel's folder.
    cell_timeout : float
        Seconds one cell (or one call from the checks) may run.
    notebook_timeout : float
        Seconds the whole notebook may take; past it the kernel is stopped.

    The held functions it serves, and refuses while any exercise is checked, are
    :func:`held_specs` of :data:`FORBIDDEN`: the ones :func:`.grading.package_site` holds.
    """

    def __init__(self, *, site: Path | None, notebook: Path | None = None, cell_timeout: float,
                 notebook_timeout: float, triton_interpret: bool = True, sandboxed: bool = True,
                 limits: sandbox.Limits = sandbox.Limits()):
        self.site, self.notebook = site, notebook
        self.cell_timeout, self.notebook_timeout = cell_timeout, notebook_timeout
        self.triton_interpret, self.sandboxed, self.limits = triton_interpret, sandboxed, limits
        self._server = served.Server(held_specs(FORBIDDEN))
        self.stopped: str | None = None  # why the kernel stopped early, if it did
        self._timeouts_in_a_row = 0
        self._launch: sandbox.Launch | None = None
        self._client = None
        self._workdir: Path | None = None

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> KernelSession:
        from jupyter_client import BlockingKernelClient

        self._workdir = Path(tempfile.mkdtemp(prefix="flashlab-kernel-"))
        self._deadline = time.monotonic() + self.notebook_timeout
        inside, outside = sandbox.connection_info(self._workdir, self.sandboxed)
        try:
            self._launch = sandbox.start(self._workdir, self.notebook, inside, site=self.site, limits=self.limits,
                                         triton_interpret=self.triton_interpret, sandboxed=self.sandboxed)
            if self._launch.sandboxed:
                outside["ip"] = f"/proc/{self._launch.inner_pid}/root{sandbox.RUN}/k"
            import zmq

            self._context = zmq.Context()
            self._context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)  # a larger message drops the kernel
            client = BlockingKernelClient(context=self._context)
            client.load_connection_info(outside)
            client.start_channels()
            self._client = client
            self._wait_ready()
            bootstrap = (_AGENT + f"\n_flashlab_install({_source(Path(codec.__file__))!r}, "
                         f"{_source(Path(__file__).with_name('probes.py'))!r})\n"
                         "del _flashlab_install\n")
            run = self._execute(bootstrap, START_TIMEOUT_S, store_history=False)
            if not run.outcome.ok:
                raise KernelDied(f"the grader could not set up the kernel: {run.outcome.line}")
        except BaseException:
            self.close()
            raise
        return self

    def _wait_ready(self) -> None:
        start = time.monotonic()
        while True:
            if self._launch.process.poll() is not None:
                log = (self._workdir / "bwrap.log")
                detail = log.read_text(errors="replace").strip()[-500:] if log.exists() else ""
                raise KernelDied(f"the kernel exited while starting (exit {self._launch.process.returncode}) {detail}")
            try:
                self._client.wait_for_ready(timeout=2)
                return
            except RuntimeError:
                if time.monotonic() - start > START_TIMEOUT_S:
                    raise KernelDied(f"the kernel did not start within {START_TIMEOUT_S:g} s") from None

    def __exit__(self, *exc) -> None:
        self.close()

    def alive(self) -> bool:
        return self._launch is not None and self._launch.process.poll() is None

    def kill(self, reason: str) -> None:
        """Stop the kernel and everything it started; later cells answer ``NotRun``."""
        self.stopped = self.stopped or reason
        if self._launch is not None and self._launch.process.poll() is None:
            try:
                os.killpg(self._launch.process.pid, signal.SIGKILL)  # bwrap and, with it, its pid namespace
            except (ProcessLookupError, PermissionError):
                self._launch.process.kill()
            try:
                self._launch.process.wait(timeout=30)
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        self._server.close()
        if self._client is not None:
            try:
                self._client.stop_channels()
            except Exception:  # noqa: BLE001
                pass
            self._client = None
        if getattr(self, "_context", None) is not None:
            self._context.destroy(linger=0)
            self._context = None
        self.kill(self.stopped or "closed")
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    # ------------------------------------------------------------ executing

    def _budget(self, timeout: float) -> float:
        return max(0.0, min(timeout, self._deadline - time.monotonic()))

    def _execute(self, code: str, timeout: float, store_history: bool = True,
                 refused: frozenset[str] = frozenset()) -> _Run:
        """Send ``code``, collect its outputs until the kernel is idle again, or time out.

        Meanwhile answer the held functions' calls (``input()`` requests on the stdin
        channel), refusing those in ``refused``; any other ``input()`` gets ``""``.
        """
        import zmq

        if self.stopped:
            return _Run(Outcome(False, "NotRun", self.stopped))
        if not self.alive():
            self.stopped = "the kernel died"
            return _Run(Outcome(False, "NotRun", "Kernel died before the cell ran"))
        client = self._client
        msg_id = client.execute(code, store_history=store_history, allow_stdin=True, stop_on_error=False)
        poller = zmq.Poller()
        channels = (client.stdin_channel, client.iopub_channel, client.shell_channel)
        for channel in channels:
            poller.register(channel.socket, zmq.POLLIN)
        run = _Run(Outcome(True))
        kept = 0
        reply: dict | None = None
        idle = False
        limit = self._budget(timeout)
        deadline = time.monotonic() + limit
        interrupted = False
        while not (idle and reply is not None):
            now = time.monotonic()
            if now >= deadline:
                if not interrupted and self.alive():
                    interrupted = True
                    self._interrupt()
                    deadline = now + INTERRUPT_GRACE_S
                    continue
                over = "the notebook" if self._deadline - now <= 0 else "the cell"
                self.kill(f"{over} ran past its time limit and the kernel did not stop when interrupted"
                          if over == "the cell" else f"the notebook ran past its {self.notebook_timeout:g} s limit")
                return _Run(Outcome(False, "TimeoutError", self._timeout_text(limit, over)), run.outputs)
            if not self.alive():
                self.stopped = "the kernel died"
                return _Run(Outcome(False, "DeadKernelError", "Kernel died while running the cell"), run.outputs)
            ready = dict(poller.poll(int(1000 * min(0.5, deadline - now)) + 1))
            if client.stdin_channel.socket in ready:
                msg = client.stdin_channel.get_msg(timeout=0)
                if msg.get("msg_type") == "input_request":
                    prompt = str(msg.get("content", {}).get("prompt", ""))
                    answer = ""
                    if prompt.startswith(served.PREFIX):
                        answer = self._server.call(prompt[len(served.PREFIX):], refused,
                                                   timeout=max(0.0, deadline - time.monotonic()))
                    client.input(answer)
            if client.iopub_channel.socket in ready and not idle:
                msg = client.iopub_channel.get_msg(timeout=0)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status" and content.get("execution_state") == "idle":
                    idle = True
                elif kind == "display_data" and REPLY_MIME in content.get("data", {}):
                    text = content["data"][REPLY_MIME]
                    if isinstance(text, str) and len(text) < 256 << 20:
                        run.replies.append(text)
                elif kind in ("stream", "display_data", "execute_result", "error"):
                    size = len(json.dumps(content, default=str))
                    if kept + size <= OUTPUT_CAP:
                        kept += size
                        run.outputs.append(_output(kind, content))
            elif idle and client.iopub_channel.socket in ready:
                client.iopub_channel.get_msg(timeout=0)  # a late message of another request
            if client.shell_channel.socket in ready:
                msg = client.shell_channel.get_msg(timeout=0)
                if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "execute_reply":
                    reply = msg["content"]
        if interrupted:
            self._timeouts_in_a_row += 1
            if self._timeouts_in_a_row >= 2:
                self.stopped = "two cells in a row ran past the time limit"
            run.outcome = Outcome(False, "TimeoutError", self._timeout_text(limit, "the cell"))
            return run
        self._timeouts_in_a_row = 0
        if reply.get("status") == "ok":
            return run
        ename = str(reply.get("ename") or "Error")
        evalue = str(reply.get("evalue") or "")
        run.outcome = Outcome(False, ename, evalue)
        return run

    def _timeout_text(self, limit: float, what: str) -> str:
        if what == "the notebook":
            return f"the notebook ran past its {self.notebook_timeout:g} s limit"
        return f"the cell ran past the {limit:g} s limit and was interrupted"

    def _interrupt(self) -> None:
        client = self._client
        try:
            client.control_channel.send(client.session.msg("interrupt_request", {}))
        except Exception:  # noqa: BLE001
            pass

    def run_cell(self, source: str) -> tuple[Outcome, list]:
        """Run one of the student's cells; (outcome, nbformat outputs)."""
        if not source.strip():
            return Outcome(True), []
        run = self._execute(source, self.cell_timeout)
        return run.outcome, run.outputs

    def call(self, name: str, args: tuple, kwargs: dict, *, exercise: str, timeout: float,
             probe: str | None = None) -> object:
        """Call the student's ``name(*args, **kwargs)`` in the kernel; return its result, as data.

        Raises the student's exception again (a builtin exception class of the same
        name, else :class:`RemoteError`), ``TimeoutError`` past ``timeout``, and
        :class:`KernelDied` when the kernel is gone.
        """
        request = codec.dumps({"name": name, "args": tuple(args), "kwargs": dict(kwargs), "exercise": exercise,
                               "probe": probe, "errstate": {k: v for k, v in np.geterr().items()}}, objects=True)
        run = self._execute(f"__flashlab__.call({request!r})", timeout, store_history=False,
                            refused=self._server.served - frozenset(STILL_SERVED.get(exercise, ())))
        if run.outcome.ename in ("NotRun", "DeadKernelError"):
            raise KernelDied(run.outcome.evalue)
        if run.outcome.ename == "TimeoutError":
            raise TimeoutError(f"{name}(...) ran past the {timeout:.3g} s limit of the tests cell and was interrupted")
        if not run.replies:
            raise RemoteError(f"the kernel gave no result for {name}(...) "
                              f"({run.outcome.line if not run.outcome.ok else 'no reply'})")
        if len(run.replies[-1]) > MAX_RESULT:
            raise RemoteError(f"{name}(...) returned {len(run.replies[-1]) / 2**20:.0f} MiB of data; the tests "
                              f"take at most {MAX_RESULT >> 20} MiB from one call")
        reply = codec.loads(run.replies[-1])
        if not isinstance(reply, dict) or len(reply) != 1:
            raise RemoteError(f"the kernel answered {name}(...) with something that is not a result")
        if "ok" in reply:
            return reply["ok"]
        raised = reply.get("raised")
        if not (isinstance(raised, tuple) and len(raised) == 2 and all(isinstance(x, str) for x in raised)):
            raise RemoteError(f"the kernel answered {name}(...) with something that is not a result")
        ename, message = raised
        cls = getattr(builtins, ename, None)
        if isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
            try:
                raise cls(message)
            except TypeError:
                pass
        raise RemoteError(f"{ename}: {message}")


def _output(kind: str, content: dict) -> dict:
    import nbformat

    if kind == "stream":
        return nbformat.v4.new_output("stream", name=content.get("name", "stdout"), text=content.get("text", ""))
    if kind == "error":
        return nbformat.v4.new_output("error", ename=content.get("ename", ""), evalue=content.get("evalue", ""),
                                      traceback=content.get("traceback", []))
    data = {k: v for k, v in content.get("data", {}).items() if isinstance(v, str)}
    if kind == "execute_result":
        return nbformat.v4.new_output("execute_result", data=data, execution_count=content.get("execution_count"))
    return nbformat.v4.new_output("display_data", data=data)


# ---------------------------------------------------------------- the checks, outside


class RemoteFunction:
    """Stands in, in the checks, for a function the student wrote in their kernel."""

    def __init__(self, checker: Checker, name: str):
        self._checker, self._name = checker, name
        self.__name__ = self.__qualname__ = name
        self.__flashlab_remote__ = self

    def __call__(self, *args, **kwargs):
        return self._checker.call(self._name, args, kwargs)

    def probe(self, kind: str, *args, **kwargs):
        """Run :mod:`.probes`' ``kind`` on the student's function, in the kernel."""
        return self._checker.call(self._name, args, kwargs, probe=kind)

    def __repr__(self) -> str:
        return f"<the student's {self._name}>"


def defined_names(source: str) -> list[str]:
    """Top-level functions and classes a solution cell defines (the names the tests call)."""
    try:
        tree = served.parse(source)
    except SyntaxError:
        return []
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


def hidden_lines(source: str) -> set[int]:
    """Line numbers (from 1) of a tests cell that lie between the hidden-tests markers."""
    found, inside = set(), False
    for number, line in enumerate(source.splitlines(), start=1):
        if BEGIN_HIDDEN in line:
            inside = True
        elif END_HIDDEN in line:
            inside = False
        elif inside:
            found.add(number)
    return found


_SALT = threading.local()
_BOOK_RNG = np.random.default_rng


def _salted_rng(seed=None):
    """``np.random.default_rng`` as the tests cells see it: while :class:`Checker` runs one
    with a salt, an integer seed draws other numbers than the book's (a student who computed
    the answers for the book's seeds in advance has the wrong ones); otherwise unchanged."""
    salt = getattr(_SALT, "value", None)
    if salt is not None and isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return _BOOK_RNG([int(salt), int(seed)])
    return _BOOK_RNG(seed)


class Checker:
    """The tests cells of one notebook, run in the grader's process against :class:`RemoteFunction` s.

    ``salt``: when given, every ``np.random.default_rng(seed)`` of the tests draws from
    ``default_rng([salt, seed])`` instead, so the hidden tests' inputs are not the ones the
    public book shows.
    """

    def __init__(self, kernel: KernelSession, salt: int | None = None):
        self.kernel = kernel
        self.salt = salt
        if salt is not None and np.random.default_rng is not _salted_rng:
            np.random.default_rng = _salted_rng
        self.namespace: dict = {"__name__": "__flashlab_checks__", "__builtins__": builtins}
        self._exercise = ""
        self._deadline = 0.0

    def define(self, names: Sequence[str]) -> None:
        for name in names:
            self.namespace[name] = RemoteFunction(self, name)

    def call(self, name: str, args: tuple, kwargs: dict, probe: str | None = None) -> object:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the tests cell ran past its {self.kernel.cell_timeout:g} s limit")
        return self.kernel.call(name, args, kwargs, exercise=self._exercise, timeout=remaining, probe=probe)

    def run(self, source: str, exercise: str, label: str) -> tuple[Outcome, list]:
        """Run one tests cell; (outcome, nbformat outputs: what it printed, its error)."""
        import io

        import nbformat

        printed = io.StringIO()

        def print_(*args, sep=" ", end="\n", file=None, flush=False):
            if printed.tell() < OUTPUT_CAP:
                printed.write(sep.join(str(a) for a in args) + end)

        self.namespace["print"] = print_
        self._exercise = exercise
        self._deadline = time.monotonic() + self.kernel.cell_timeout
        filename = f"<tests {label}>"
        outcome = Outcome(True)
        _SALT.value = self.salt
        try:
            exec(compile(source, filename, "exec"), self.namespace)  # noqa: S102 - the book's own tests
        except Exception as exc:  # noqa: BLE001 - any failure of the checks is the answer's
            ename = "NotImplementedError" if isinstance(exc, NotImplementedError) else type(exc).__name__
            if isinstance(exc, KernelDied):
                ename = "DeadKernelError"
            evalue = str(exc)
            lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
            if not evalue.strip():
                evalue = f"(line {lines[-1]} of the cell)" if lines else ""
            check = "" if not lines else "hidden" if lines[-1] in hidden_lines(source) else "visible"
            outcome = Outcome(False, ename, evalue, check)
        finally:
            _SALT.value = None
            self.namespace.pop("print", None)
        outputs = []
        if printed.getvalue():
            outputs.append(nbformat.v4.new_output("stream", name="stdout", text=printed.getvalue()))
        if not outcome.ok:
            outputs.append(nbformat.v4.new_output("error", ename=outcome.ename, evalue=outcome.evalue, traceback=[]))
        return outcome, outputs
