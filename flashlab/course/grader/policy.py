"""What a submission's code may contain: a static check, made by the grader before anything runs.

The probes (:mod:`.probes`) run in the student's kernel, so code in that kernel could
forge what they report: replace the agent ``__flashlab__`` that runs them, reach it
through ``get_ipython()``, ``globals()``, ``sys.modules``, a frame or the garbage
collector, or patch NumPy under them. No defence inside the kernel holds against that
in CPython, so this check runs outside it, in the grader, on the notebook's text.

Every code cell the student wrote or edited (every code cell whose source is not,
character for character, a code cell of the book's notebook) is transformed as
IPython would (magics, shell escapes) and parsed; :func:`check_cells` walks the tree
and refuses:

- imports outside :data:`ALLOWED_MODULES` and the teaching modules
  (:data:`TEACHING_PACKAGES`); relative and ``*`` imports;
- attribute names that start with ``_``; dunder names (``__x__``), except defining
  ``__init__``, ``__repr__`` and ``__post_init__`` in a class; IPython's history names
  (``_ih``, ``_oh``, ``_i3``, ...); string and bytes literals that contain ``__``;
- the names in :data:`FORBIDDEN_NAMES` (``getattr``, ``globals``, ``exec``,
  ``get_ipython``, ``sys``, ``gc``, ...), whoever bound them; the one use of
  ``globals()`` the book's own cells make, ``"name" in globals()``, is allowed;
- the attribute names in :data:`FORBIDDEN_ATTRIBUTES` (frames, code objects,
  generators, tracebacks, ``modules``, ``settrace``, the dangerous modules by name)
  and the module paths in :data:`FORBIDDEN_PATHS` (``np.load``, pickles, compilers);
- assigning, deleting or augmenting an attribute or an item of an object the
  student's code did not make (a module, a name bound by the book's cells or
  IPython, or a name bound to one of those): ``np.asarray = ...`` is refused,
  ``self.m = ...`` is not;
- ``str.format`` and ``format_map`` on a format string that is not a literal, or
  whose fields look attributes or items up (``"{0.x}"``, ``"{0[k]}"``);
- naming a package function the grader holds (``held``: those an exercise asks the student
  to write, :func:`.session.held_specs`): importing it, looking it up on its module
  (``events.pingpong``), or using a name the book's cells imported it as. The grader refuses
  these functions only while the tests run; a cell that names one could call it earlier,
  while the chapter's cells run, and keep a table of its answers for the tests to find.

One violation anywhere costs the whole notebook (:func:`.grading.grade_notebook`).
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import served

#: Modules a submission may import (and their submodules, for numpy and triton).
ALLOWED_MODULES = frozenset({
    "numpy", "math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "collections",
    "dataclasses", "typing", "heapq", "bisect", "triton", "triton.language",
})
#: Packages whose submodules may be imported besides ``ALLOWED_MODULES`` (numpy.linalg, ...).
ALLOWED_PACKAGES = ("numpy.", "collections.")
#: The package's teaching modules, which the chapters and their exercises import (and
#: their submodules); not the course tools, the lab, the kernels or the grader.
TEACHING_PACKAGES = ("flashlab.reference", "flashlab.sim", "flashlab.memory", "flashlab.cycles",
                     "flashlab.hardware", "flashlab.parallel", "flashlab.generations")
#: Dangerous modules: refused as names (even when a book cell bound them) and as attributes.
DANGEROUS_MODULES = frozenset({
    "sys", "os", "gc", "inspect", "builtins", "importlib", "ctypes", "subprocess", "signal", "threading", "types",
    "io", "pathlib", "shutil", "pickle", "marshal", "weakref", "atexit", "traceback", "warnings", "operator",
})
#: Builtins and IPython names that reach the kernel's namespaces, run text as code, or open files.
FORBIDDEN_NAMES = DANGEROUS_MODULES | frozenset({
    "exec", "eval", "compile", "globals", "locals", "vars", "getattr", "setattr", "delattr", "open", "breakpoint",
    "input", "help", "exit", "quit", "memoryview", "get_ipython", "In", "Out", "display",
})
#: Attribute names refused whatever object they are looked up on.
FORBIDDEN_ATTRIBUTES = DANGEROUS_MODULES | frozenset({
    "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "f_trace", "f_lasti", "f_lineno",
    "gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "cr_frame", "cr_code", "cr_await", "cr_origin",
    "ag_frame", "ag_code", "ag_await", "tb_frame", "tb_next", "tb_lasti", "tb_lineno",
    "ctypeslib", "modules", "settrace", "setprofile", "user_ns", "user_global_ns", "course", "grader",
    # routes from allowed modules to code run from text, or to raw memory
    "get_type_hints", "singledispatch", "singledispatchmethod", "as_strided", "f2py", "distutils", "measure",
    "runstring", "extbuild", "cpp_extension", "load_inline",
})
#: Module paths refused as attributes and imports (a path and everything under it).
FORBIDDEN_PATHS = (
    "numpy.load", "numpy.lib.npyio", "numpy.lib.format", "numpy.testing", "numpy.compat",
    "torch.load", "torch.utils", "torch.hub", "torch.package", "torch.ops", "torch.library", "torch.classes",
    "torch.serialization", "torch.jit", "torch.fx", "torch.compiler", "torch.distributed", "torch.multiprocessing",
    "triton.runtime", "triton.compiler", "triton.knobs", "triton.backends", "triton.tools", "triton.testing",
)
#: Dunder methods a submission's classes may define.
ALLOWED_DUNDER_DEFS = frozenset({"__init__", "__repr__", "__post_init__"})
_HISTORY = re.compile(r"^_(?:i{1,3}|ih|oh|dh|sh|i\d+|\d+|_+)$")
_MAGIC = "get_ipython"


@dataclass(frozen=True)
class Violation:
    """One construct a submission may not contain: where it is, and what it is.

    ``cell`` is the index of the code cell in the notebook, ``label`` the grade_id of
    the cell when it has one (``""`` otherwise), ``line`` the line in the cell (from 1,
    as the student's notebook numbers it).
    """

    cell: int
    label: str
    line: int
    what: str

    def __str__(self) -> str:
        where = f"cell {self.cell}" + (f" ({self.label})" if self.label else "")
        return f"{where}, line {self.line}: {self.what}"


def transformed(source: str) -> str:
    """``source`` as IPython runs it: magics and shell escapes become ``get_ipython()`` calls."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _forbidden_path(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in FORBIDDEN_PATHS)


def _allowed_module(name: str) -> bool:
    if _forbidden_path(name):
        return False
    if name in ALLOWED_MODULES or name.startswith(ALLOWED_PACKAGES):
        return True
    return any(name == p or name.startswith(p + ".") for p in TEACHING_PACKAGES)


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node


def _targets(node: ast.AST) -> Iterable[str]:
    """Names bound by an assignment target (a, (a, b), [a, *b]); not attributes or items."""
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


class _Bindings(ast.NodeVisitor):
    """First pass over every checked cell: the names the student's code binds itself, the
    module aliases it imports, and the names it binds to an object it did not make."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.modules: dict[str, str] = {}
        self.copies: list[tuple[str, ast.AST]] = []  # name = <expression>, judged once all is known

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.modules[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.modules[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            self.modules[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        args = node.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if arg is not None:
                self.bound.add(arg.arg)
        if not isinstance(node, ast.Lambda):
            self.bound.add(node.name)
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.bound.add(node.name)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            for name in _targets(target):
                self.bound.add(name)
                self.copies.append((name, node.value))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        for name in _targets(node.target):
            self.bound.add(name)
            if node.value is not None:
                self.copies.append((name, node.value))
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.bound.add(node.target.id)
        self.copies.append((node.target.id, node.value))
        self.generic_visit(node)

    def _loop(self, node: ast.For | ast.AsyncFor | ast.comprehension) -> None:
        for name in _targets(node.target):
            self.bound.add(name)
            self.copies.append((name, node.iter))
        self.generic_visit(node)

    visit_For = visit_AsyncFor = visit_comprehension = _loop

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            for name in _targets(node.optional_vars):
                self.bound.add(name)
                self.copies.append((name, node.context_expr))
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def owned(self) -> set[str]:
        """Names the student's code binds to objects it made: not modules, not names it never
        binds, not names it binds to one of those (``m = np``, ``t = type(x)``)."""
        own = self.bound - set(self.modules)
        changed = True
        while changed:
            changed = False
            for name, value in self.copies:
                if name in own and self._borrowed(value, own):
                    own.discard(name)
                    changed = True
        return own

    @staticmethod
    def _borrowed(value: ast.AST, own: set[str]) -> bool:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "type":
            return True
        root = _root(value)
        if isinstance(value, ast.Call):
            return False
        return isinstance(root, ast.Name) and root.id not in own


def _held_paths(held: Iterable[str]) -> frozenset[str]:
    """Dotted paths (``flashlab.sim.events.pingpong``) of the held module-level functions and
    classes among ``held`` ("module:qualname"); a method (``Cls.update``) is held through
    its instances, which no static check can follow, so it is left to the grader."""
    return frozenset(spec.replace(":", ".") for spec in held if "." not in spec.split(":", 1)[1])


class _Checker(ast.NodeVisitor):
    """Second pass over one cell: every construct the policy refuses, with its line."""

    def __init__(self, own: set[str], modules: dict[str, str], held: frozenset[str] = frozenset()) -> None:
        self.own, self.modules, self.held = own, modules, held
        self.found: list[tuple[int, str]] = []
        self._class_depth: list[bool] = []  # per enclosing scope: is it a class body?
        self._membership: set[int] = set()  # ids of `globals()` calls inside `"x" in globals()`

    def _refuse(self, node: ast.AST, what: str) -> None:
        self.found.append((getattr(node, "lineno", 1), what))

    # ------------------------------------------------------------ names

    def _identifier(self, node: ast.AST, name: str, kind: str, definition: bool = False) -> None:
        if name.startswith("__") and name.endswith("__") and len(name) > 4:
            in_class = bool(self._class_depth) and self._class_depth[-1]
            if not (definition and in_class and name in ALLOWED_DUNDER_DEFS):
                self._refuse(node, f"the {kind} `{name}` is not allowed in a submission (dunder names reach "
                                   "the interpreter's internals; a class may define only "
                                   f"{', '.join(sorted(ALLOWED_DUNDER_DEFS))})")
            return
        if name.startswith("__") or _HISTORY.match(name):
            self._refuse(node, f"the {kind} `{name}` is not allowed in a submission (names starting with `__`, "
                               "and IPython's history names, reach the kernel's internals)")
            return
        if name in FORBIDDEN_NAMES:
            self._refuse(node, f"the name `{name}` is not allowed in a submission (it can reach the grader's "
                               "objects)")

    def _held(self, node: ast.AST, path: str | None) -> None:
        if path is not None and path in self.held:
            self._refuse(node, f"`{path.rsplit('.', 1)[1]}` (`{path}`) is not allowed in a submission: an "
                               "exercise asks you to write it yourself, so the grader holds the package's own")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id not in self.own:  # a name the book's cells (or an import) bound to a held function
            self._held(node, self.modules.get(node.id))
        if node.id == "globals" and id(node) in self._membership:
            return
        if node.id == _MAGIC:
            self._refuse(node, "IPython magics and shell commands (`%`, `!`), and `get_ipython`, are not "
                               "allowed in a submission (they can reach the grader's objects)")
            return
        self._identifier(node, node.id, "name")

    def visit_arg(self, node: ast.arg) -> None:
        self._identifier(node, node.arg, "parameter")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg is not None:
            self._identifier(node, node.arg, "keyword")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self._identifier(node, name, "name")

    visit_Nonlocal = visit_Global

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._identifier(node, node.name, "name")
        self.generic_visit(node)

    def _scope(self, node: ast.AST, is_class: bool) -> None:
        self._class_depth.append(is_class)
        self.generic_visit(node)
        self._class_depth.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._identifier(node, node.name, "function name", definition=True)
        self._scope(node, False)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._scope(node, False)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._identifier(node, node.name, "class name")
        self._scope(node, True)

    def visit_Compare(self, node: ast.Compare) -> None:
        # `"name" in globals()`: the one use of globals() the book's cells make (a bool)
        if (len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
                and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
                and isinstance(node.comparators[0], ast.Call)
                and isinstance(node.comparators[0].func, ast.Name) and node.comparators[0].func.id == "globals"
                and not node.comparators[0].args and not node.comparators[0].keywords):
            self._membership.add(id(node.comparators[0].func))
        self.generic_visit(node)

    # ------------------------------------------------------------ imports

    def _import(self, node: ast.AST, name: str, alias: str | None) -> None:
        if not _allowed_module(name):
            self._refuse(node, f"importing `{name}` is not allowed in a submission (only numpy, math, the "
                               "standard library's number and container modules, triton, and the package's "
                               "teaching modules: policy.ALLOWED_MODULES, TEACHING_PACKAGES)")
        if alias is not None:
            self._identifier(node, alias, "name")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._import(node, alias.name, alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self._refuse(node, "relative imports are not allowed in a submission")
            return
        for alias in node.names:
            if alias.name == "*":
                self._refuse(node, f"`from {module} import *` is not allowed in a submission (name what you use)")
                continue
            full = f"{module}.{alias.name}"
            allowed = _allowed_module(full) if module == "flashlab" else (
                _allowed_module(module) and not _forbidden_path(full))
            if not allowed:  # `from numpy import load` is `numpy.load`
                self._refuse(node, f"importing `{full}` is not allowed in a submission")
            self._attribute_name(node, alias.name)
            self._identifier(node, alias.asname or alias.name, "name")
            self._held(node, full)

    # ------------------------------------------------------------ attributes

    def _attribute_name(self, node: ast.AST, attr: str) -> None:
        if attr.startswith("_"):
            self._refuse(node, f"the attribute `{attr}` is not allowed in a submission (attributes starting "
                               "with `_` are private or the interpreter's internals)")
        elif attr in FORBIDDEN_ATTRIBUTES or attr.startswith("co_"):
            self._refuse(node, f"the attribute `{attr}` is not allowed in a submission (it can reach the "
                               "grader's objects)")

    def _path(self, node: ast.Attribute) -> str | None:
        parts = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.modules:
            return ".".join([self.modules[value.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._attribute_name(node, node.attr)
        path = self._path(node)
        if path is not None and _forbidden_path(path):
            self._refuse(node, f"`{path}` is not allowed in a submission (it loads pickles or compiled code, "
                               "or reaches the runtime's internals)")
        self._held(node, path)
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._store(node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._store(node)
        self.generic_visit(node)

    def _store(self, node: ast.Attribute | ast.Subscript) -> None:
        root = _root(node)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in self.own:
            return  # an item of the student's own array, list or dict
        if isinstance(root, ast.Name) and root.id in self.own:
            return
        shown = ast.unparse(node)
        owner = root.id if isinstance(root, ast.Name) else "an expression"
        self._refuse(node, f"changing `{shown}` is not allowed in a submission (`{owner}` is not an object "
                           "your code made: a module, or something the book or the kernel defined)")

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:
            self._attribute_name(node, attr)
        self.generic_visit(node)

    # ------------------------------------------------------------ literals and formats

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if isinstance(text, str) and "__" in text:
            self._refuse(node, "a string containing `__` is not allowed in a submission (it can name the "
                               "interpreter's internals)")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
            literal = isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)
            if not literal:
                self._refuse(node, f"`.{func.attr}` on a format string that is not a literal is not allowed in "
                                   "a submission (write an f-string)")
            else:
                try:
                    fields = [f for _, f, _, _ in string.Formatter().parse(func.value.value) if f]
                except ValueError:
                    fields = []
                if any("." in f or "[" in f for f in fields):
                    self._refuse(node, "a format field that looks up an attribute or an item (`{0.x}`, "
                                       "`{0[k]}`) is not allowed in a submission")
        self.generic_visit(node)


def _tree(source: str) -> ast.Module:
    return served.parse(transformed(source))


def check_cells(cells: Sequence[tuple[int, str, str]], book_sources: Iterable[str] = (),
                held: Iterable[str] = ()) -> list[Violation]:
    """Every construct the policy refuses in ``cells``, in cell and line order.

    Parameters
    ----------
    cells : sequence of (index, label, source)
        The cells checked (the student's own: see :func:`checked_cells`): their index in
        the notebook, their grade_id or ``""``, their source.
    book_sources : iterable of str
        The book's code cells: the modules they import count as modules (``np`` bound by
        the book's ``import numpy as np`` cannot be changed either).
    held : iterable of str
        Package functions the grader holds ("module:qualname"), which the cells may not name.

    A cell that does not parse is a violation too (it could not run anyway).
    """
    found: list[Violation] = []
    trees: list[tuple[int, str, ast.Module]] = []
    for index, label, source in cells:
        try:
            trees.append((index, label, _tree(source)))
        except (SyntaxError, ValueError) as exc:  # ValueError: a null byte in the source
            line = getattr(exc, "lineno", None) or 1
            found.append(Violation(index, label, line, f"the cell does not parse ({type(exc).__name__}: "
                                                         f"{getattr(exc, 'msg', exc)})"))
    bindings = _Bindings()
    for _, _, tree in trees:
        bindings.visit(tree)
    book = _Bindings()
    for source in book_sources:
        try:
            book.visit(_tree(source))
        except (SyntaxError, ValueError):
            continue
    modules = {**book.modules, **bindings.modules}
    own = bindings.owned() - set(modules)
    held_paths = _held_paths(held)
    for index, label, tree in trees:
        checker = _Checker(own, modules, held_paths)
        checker.visit(tree)
        found += [Violation(index, label, line, what) for line, what in checker.found]
    return sorted(set(found), key=lambda v: (v.cell, v.line, v.what))


def checked_cells(notebook, book) -> list[tuple[int, str, str]]:
    """The code cells of ``notebook`` that the policy checks: (index, grade_id or "", source)
    of each whose source is not exactly that of a code cell of the book's notebook ``book``."""
    unchanged = {cell.source for cell in book.cells if cell.cell_type == "code"}
    picked = []
    for index, cell in enumerate(notebook.cells):
        if cell.get("cell_type") != "code" or cell.source in unchanged:
            continue
        meta = cell.get("metadata", {}).get("nbgrader")
        label = meta.get("grade_id", "") if isinstance(meta, dict) else ""
        picked.append((index, label if isinstance(label, str) else "", cell.source))
    return picked


def check_notebook(notebook, book, held: Iterable[str] = ()) -> list[Violation]:
    """:func:`check_cells` of the cells :func:`checked_cells` picks, the book's cells as context."""
    sources = [cell.source for cell in book.cells if cell.cell_type == "code"]
    return check_cells(checked_cells(notebook, book), sources, held)


def summary(violations: Sequence[Violation]) -> str:
    """The grade's message for a refused notebook: the first violation, and how many more."""
    first = violations[0]
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    return (f"the notebook was not run: its code breaks the submission code policy at {first}{more}; "
            "see the instructor's page, 'What a submission's code may contain'")
