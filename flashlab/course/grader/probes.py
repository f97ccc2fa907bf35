"""Probes: what a tests cell asks about *how* an answer computes, not only what it returns.

A tests cell calls these with the student's function. In a plain kernel (the
student's own notebook, or the book run top to bottom) the probe runs right there.
When the grader checks a submission the tests run outside the student's kernel and
``fn`` is a stand-in for the student's function (see
:mod:`flashlab.course.grader.session`); the probe then runs inside the student's
kernel, where the function lives, and only its findings come back, as data.

The file is self-contained (standard library and NumPy; Triton only inside
:func:`triton_launches`): the grader sends its source to the student's kernel.
"""

from __future__ import annotations

import numpy as np

__all__ = ["calls_seen", "inputs_after", "triton_launches", "ufunc_log"]


def _remote(fn):
    return getattr(fn, "__flashlab_remote__", None)


def inputs_after(fn, *args, **kwargs) -> list:
    """Call ``fn`` on copies of ``args``; return the copies as the call left them.

    A test compares them with ``args`` to check that ``fn`` did not modify what it
    was given (the caller's arrays, dictionaries and lists are never touched).
    """
    remote = _remote(fn)
    if remote is not None:
        return list(remote.probe("inputs_after", *args, **kwargs))
    import copy

    copies = copy.deepcopy(list(args))
    fn(*copies, **kwargs)
    return copies


def calls_seen(fn, inner: str, *args, **kwargs) -> list[tuple]:
    """Call ``fn(*args, **kwargs)`` and record each call it makes to the global ``inner``.

    ``inner`` names another function of the notebook (e.g. ``"update_row"``), looked
    up where ``fn`` was defined; for every call the shapes of its arguments are
    recorded (``()`` for a scalar). The result is the list of these shape tuples, one
    per call. ``inner`` is put back even if ``fn`` raises.
    """
    remote = _remote(fn)
    if remote is not None:
        return remote.probe("calls_seen", inner, *args, **kwargs)
    namespace = fn.__globals__
    original = namespace[inner]
    seen: list[tuple] = []

    def spy(*a, **k):
        seen.append(tuple(tuple(np.shape(x)) for x in (*a, *k.values())))
        return original(*a, **k)

    namespace[inner] = spy
    try:
        fn(*args, **kwargs)
    finally:
        namespace[inner] = original
    return seen


class _Recorded(np.ndarray):
    """An ndarray that logs each ufunc it takes part in: (ufunc name, elements out)."""

    log: list = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [_plain(x) for x in inputs]
        kwargs = {k: tuple(_plain(x) for x in v) if k == "out" else _plain(v) for k, v in kwargs.items()}
        result = getattr(ufunc, method)(*plain, **kwargs)
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        first = result[0] if isinstance(result, tuple) else result
        _Recorded.log.append((name, int(np.size(first))))
        if isinstance(result, tuple):
            return tuple(r.view(_Recorded) if isinstance(r, np.ndarray) else r for r in result)
        return result.view(_Recorded) if isinstance(result, np.ndarray) else result

    def __array_function__(self, func, types, args, kwargs):
        # np.concatenate, np.stack, np.where, ... keep the watch on what they build from a
        # watched array (without this, a plain list among the inputs can drop it)
        result = super().__array_function__(func, tuple(t for t in types if t is not _Recorded) or (np.ndarray,),
                                            args, kwargs)
        return _watch(result)


def _plain(value):
    return value.view(np.ndarray) if isinstance(value, _Recorded) else value


def _watch(value):
    if isinstance(value, np.ndarray) and not isinstance(value, _Recorded):
        return value.view(_Recorded)
    if isinstance(value, (tuple, list)):
        return type(value)(_watch(v) for v in value)
    return value


def ufunc_log(fn, *args, **kwargs) -> list[tuple[str, int]]:
    """Call ``fn`` with its array arguments watched; return every ufunc applied to them.

    Each NumPy array among ``args`` is passed as a view that logs the ufuncs it (and
    every array computed from it) goes through, as ``(name, elements of the result)``,
    e.g. ``("exp", 80)``; reductions appear as ``"maximum.reduce"``, ``"add.reduce"``.
    Converting the inputs first (``np.asarray``, ``np.array``, ``astype``) keeps the
    watch: during the call ``np.asarray`` and ``np.array`` keep the view, in NumPy and
    in ``fn``'s globals.
    """
    remote = _remote(fn)
    if remote is not None:
        return [tuple(item) for item in remote.probe("ufunc_log", *args, **kwargs)]
    asarray, array = np.asarray, np.array

    def keep_asarray(a, dtype=None, order=None, **kw):
        return np.asanyarray(a, dtype=dtype, order=order, **kw)

    def keep_array(a, dtype=None, *, copy=True, order="K", subok=True, ndmin=0, **kw):
        return array(a, dtype=dtype, copy=copy, order=order, subok=True, ndmin=ndmin, **kw)

    namespace = getattr(fn, "__globals__", {})
    swapped = {k: v for k, v in namespace.items() if v is asarray or v is array}
    _Recorded.log = []
    watched = [a.view(_Recorded) if isinstance(a, np.ndarray) else a for a in args]
    np.asarray, np.array = keep_asarray, keep_array
    for k, v in swapped.items():
        namespace[k] = keep_asarray if v is asarray else keep_array
    try:
        fn(*watched, **kwargs)
    finally:
        np.asarray, np.array = asarray, array
        namespace.update(swapped)
    log, _Recorded.log = _Recorded.log, []
    return log


def triton_launches(fn, *args, **kwargs) -> list[tuple[str, tuple, dict]]:
    """Call ``fn(*args, **kwargs)`` and record every Triton kernel it launches.

    Each launch is ``(kernel name, grid, numbers)``: the grid as a tuple of ints (``()``
    when it is a function of the meta-parameters) and the keyword arguments that are
    plain numbers (the constexprs, e.g. ``{"BLOCK": 16}``). Works for kernels that run
    under Triton's interpreter (``TRITON_INTERPRET=1``) and for compiled ones.
    """
    remote = _remote(fn)
    if remote is not None:
        return [(str(name), tuple(grid), dict(numbers))
                for name, grid, numbers in remote.probe("triton_launches", *args, **kwargs)]
    import importlib

    seen: list[tuple[str, tuple, dict]] = []
    patched = []
    for module, cls in (("triton.runtime.interpreter", "InterpretedFunction"), ("triton.runtime.jit", "JITFunction")):
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue

        def run(self, *a, grid, warmup=False, _original=owner.run, **k):
            shape = tuple(int(g) for g in grid) if isinstance(grid, (tuple, list)) else ()
            numbers = {key: v for key, v in k.items() if type(v) in (int, float, bool)}
            seen.append((getattr(getattr(self, "fn", None), "__name__", "?"), shape, numbers))
            return _original(self, *a, grid=grid, warmup=warmup, **k)

        patched.append((owner, owner.run))
        owner.run = run
    try:
        fn(*args, **kwargs)
    finally:
        for owner, original in patched:
            owner.run = original
    return seen
