"""Held functions: the package functions an exercise forbids live outside the sandbox.

A function that some exercise asks the student to write (``flash1_step``,
``OnlineSoftmaxState.update``, ... :data:`.session.FORBIDDEN`) is not in the package
copy a sandbox imports: :func:`hold` replaces its body there by a call to
:mod:`flashlab._held`, which sends the arguments out of the kernel as data (the
``input()`` request of Jupyter's stdin channel) and returns the answer. The grader
answers with :class:`Server`, a process of its own that runs the real function on
the decoded arguments, unless an exercise's tests are calling the student's code
right then; then the call raises in the student's code.

So the chapter's own cells (which call these functions to show them at work) run as
in the book, while nothing inside the kernel can recover the function: its code is
not there, and whether it is switched off is decided by the grader, outside.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from . import codec

#: What a held function's ``input()`` prompt starts with; the rest is its request, as codec text.
PREFIX = "\x1bflashlab-held-call "
#: The largest request or answer (characters) the grader accepts.
MAX_TEXT = 128 << 20
#: The parts of the package whose dataclasses a held call may send (``flashlab.<part>``).
DATA_PACKAGES = frozenset({"reference", "sim", "hardware", "memory", "cycles", "parallel", "generations"})
#: Address space of the grader's helper process (bytes), as a sandbox's (:class:`.sandbox.Limits`).
HELPER_MEMORY = 8 << 30

_RUNTIME = '''"""Functions the grader holds: their bodies are not in this copy of the package.

Each one was replaced by a call to :func:`call`, which asks the grader (through
Jupyter's stdin channel) to run the real function on the arguments, sent as data.
While an exercise's tests call your code, the grader refuses, and the call raises.
"""

import builtins
import sys

PREFIX = %r


def call(spec, owner, args, kwargs):
    codec = sys.modules.get("_flashlab_codec")
    short = spec.partition(":")[2]
    if codec is None:
        raise RuntimeError(short + " runs only when the grader is there to answer")
    text = codec.dumps({"spec": spec, "self": owner, "args": tuple(args), "kwargs": dict(kwargs)},
                       objects=True)
    try:
        answer = builtins.input(PREFIX + text)
    except Exception as exc:  # StdinNotImplementedError outside a grader's call
        raise RuntimeError(short + " could not reach the grader: " + type(exc).__name__) from None
    reply = codec.loads(answer, objects=True)
    if "raised" in reply:
        ename, message = reply["raised"]
        cls = getattr(builtins, ename, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            raise cls(message)
        raise RuntimeError(ename + ": " + message)
    return owner if reply.get("returns_self") else reply["ok"]
''' % PREFIX


#: ast.parse is not safe to call from several threads at once in CPython 3.11 (its recursion
#: guard is shared: "AST constructor recursion depth mismatch"); the grader parses under this lock.
PARSE_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """``ast.parse(source)``, one thread at a time."""
    with PARSE_LOCK:
        return ast.parse(source)


def _stub(node: ast.FunctionDef, spec: str, method: bool, indent: str) -> list[str]:
    inner = indent + "    "
    head = f"{indent}def {node.name}(self, *args, **kwargs):" if method else f"{indent}def {node.name}(*args, **kwargs):"
    lines = [head]
    doc = ast.get_docstring(node, clean=False)
    if doc is not None:
        lines.append(f"{inner}{doc!r}")
    owner = "self" if method else "None"
    lines.append(f'{inner}return __import__("flashlab._held", fromlist=["call"]).call({spec!r}, {owner}, args, kwargs)')
    return lines


def hold_source(source: str, module: str, quals: Iterable[str]) -> str:
    """``source`` of ``module`` with the functions and methods named by ``quals`` held.

    ``quals`` are qualified names inside the module (``"flash1_step"``,
    ``"OnlineSoftmaxState.update"``); each def keeps its decorators and docstring,
    takes ``*args, **kwargs`` and forwards them to the grader. Raises ``LookupError``
    for a name that is not a def of this module.
    """
    tree = parse(source)
    found: list[tuple[ast.FunctionDef, str, bool, int]] = []
    for qual in quals:
        *outer, name = qual.split(".")
        body, col = tree.body, 0
        for part in outer:
            cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
            if cls is None:
                raise LookupError(f"{module}: no class {part!r} for {qual!r}")
            body, col = cls.body, cls.body[0].col_offset
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == name), None)
        if node is None:
            raise LookupError(f"{module}: no def {qual!r}")
        found.append((node, f"{module}:{qual}", bool(outer), col))
    lines = source.splitlines()
    for node, spec, method, col in sorted(found, key=lambda f: -f[0].lineno):
        lines[node.lineno - 1:node.end_lineno] = _stub(node, spec, method, " " * col)
    return "\n".join(lines) + "\n"


def hold(package: Path, specs: Iterable[str]) -> None:
    """Hold ``specs`` ("module:qualname") in the package copy at ``package`` (its ``flashlab/``)."""
    by_module: dict[str, list[str]] = {}
    for spec in specs:
        module, _, qual = spec.partition(":")
        by_module.setdefault(module, []).append(qual)
    for module, quals in sorted(by_module.items()):
        parts = module.split(".")
        if parts[0] != "flashlab":
            raise ValueError(f"only package functions can be held; got {module!r}")
        path = package.joinpath(*parts[1:]).with_suffix(".py")
        if not path.is_file():
            path = package.joinpath(*parts[1:], "__init__.py")
        path.write_text(hold_source(path.read_text(encoding="utf-8"), module, quals), encoding="utf-8")
    (package / "_held.py").write_text(_RUNTIME, encoding="utf-8")


_UNAVAILABLE = '''"""flashlab's Triton kernels are not in this copy of the package.

While a notebook is graded its kernels do not run: they would compute an exercise's answer
by another route (the combine kernel merges log-sum-exps, the FA4 kernel counts rescales).
A chapter's cells that launch them fail; no exercise needs them.
"""


class Unavailable:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(self._name + ": flashlab's kernels do not run while a notebook is graded")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(self._name + "." + attr)

    def __repr__(self):
        return "<" + self._name + ": not available while a notebook is graded>"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return Unavailable(__name__ + "." + name)
'''


def leave_out_kernels(package: Path) -> None:
    """Replace every module of ``package/kernels`` by one whose names are :class:`Unavailable`
    (importable, but raising when called), so that no Triton kernel of the package runs."""
    folder = package / "kernels"
    for path in folder.glob("*.py"):
        path.write_text(_UNAVAILABLE, encoding="utf-8")


# ---------------------------------------------------------------- the grader's side


def _allowed_class(module: str, name: str) -> type:
    """The dataclass ``module:name`` a held call may send (the package's data types only)."""
    parts = (*module.split("."), *name.split("."))
    if not (module.split(".")[:2][-1] in DATA_PACKAGES and module.startswith("flashlab.")
            and all(p.isidentifier() and not p.startswith("_") for p in parts)):
        raise codec.CodecError(f"a held call cannot send a {module}:{name}")
    cls: object = importlib.import_module(module)
    for part in name.split("."):
        cls = getattr(cls, part)
    own = getattr(cls, "__module__", "") if isinstance(cls, type) else ""
    if not (dataclasses.is_dataclass(cls) and own.startswith("flashlab.")
            and own.split(".")[1] in DATA_PACKAGES):
        raise codec.CodecError(f"a held call cannot send a {module}:{name}")
    return cls


def _resolve(spec: str) -> tuple[object, type | None]:
    module, _, qual = spec.partition(":")
    owner: object = importlib.import_module(module)
    *path, attr = qual.split(".")
    for part in path:
        owner = getattr(owner, part)
    return getattr(owner, attr), owner if path else None


def answer(text: str, served: frozenset[str], refused: frozenset[str] = frozenset()) -> str:
    """The reply to one held call's request (codec text): the real function's result, or
    its exception; a ``RuntimeError`` for a function in ``refused``."""
    try:
        request = codec.loads(text, objects=_allowed_class)
        if not (isinstance(request, dict) and set(request) == {"spec", "self", "args", "kwargs"}):
            raise codec.CodecError("not a held call")
        spec, owner, args, kwargs = request["spec"], request["self"], request["args"], request["kwargs"]
        if spec not in served:
            raise PermissionError(f"{spec!r} is not one of the functions the grader holds")
        if spec in refused:
            raise RuntimeError(f"{spec.partition(':')[2]} is switched off while this exercise is graded: "
                               "write the answer yourself, without the package's solutions")
        if not (isinstance(args, tuple) and isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
            raise codec.CodecError("a held call's arguments must be a tuple and a dict of str keys")
        fn, cls = _resolve(spec)
        if cls is not None:
            if not isinstance(owner, cls):
                raise TypeError(f"{spec.partition(':')[2]} needs a {cls.__name__} as self")
            value = fn(owner, *args, **kwargs)
            return codec.dumps({"ok": None if value is owner else value, "returns_self": value is owner},
                               objects=True)
        return codec.dumps({"ok": fn(*args, **kwargs)}, objects=True)
    except Exception as exc:  # noqa: BLE001 - the student's code sees the exception
        return codec.dumps({"raised": (type(exc).__name__, str(exc)[:2000])})


class Server:
    """A process of the grader's that answers held calls (started on the first one).

    It runs the real package functions on arguments decoded as data; a call that runs
    past its time is answered with a ``TimeoutError`` and the process is replaced.
    """

    def __init__(self, served: Iterable[str]):
        self.served = frozenset(served)
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                ["prlimit", f"--as={HELPER_MEMORY}", "--core=0", "--",
                 sys.executable, "-m", "flashlab.course.grader.served"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, encoding="utf-8",
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
                     "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"})
            self._proc.stdin.write(json.dumps(sorted(self.served)) + "\n")
            self._proc.stdin.flush()
        return self._proc

    def call(self, text: str, refused: Iterable[str], timeout: float) -> str:
        """Answer one request (codec text): the real function's result, or a ``RuntimeError``
        for a function in ``refused`` (every held one while an exercise is checked)."""
        if len(text) > MAX_TEXT:
            return codec.dumps({"raised": ("RuntimeError", "a held call's arguments are too large")})
        with self._lock:
            proc = self._start()
            reply: list[str] = []
            reader = threading.Thread(target=lambda: reply.append(proc.stdout.readline()), daemon=True)
            try:
                proc.stdin.write(json.dumps({"text": text, "refused": sorted(refused)}) + "\n")
                proc.stdin.flush()
            except OSError:
                self.close()
                return codec.dumps({"raised": ("RuntimeError", "the grader's helper process failed")})
            reader.start()
            reader.join(max(0.0, timeout))
            if not reply or not reply[0].endswith("\n"):
                self.close()
                return codec.dumps({"raised": ("TimeoutError", f"a held function ran past {timeout:.3g} s "
                                               "in the grader and was stopped")})
            return reply[0][:-1]

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self._proc = None


def _serve() -> None:
    served = frozenset(json.loads(sys.stdin.readline()))
    builtins.print = lambda *a, **k: None  # the package functions' prints must not reach the pipe
    out = sys.stdout
    sys.stdout = open("/dev/null", "w")  # noqa: SIM115
    for line in sys.stdin:
        request = json.loads(line)
        out.write(answer(request["text"], served, frozenset(request["refused"])) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
