"""Values as data: what crosses between the student's kernel and the grader.

The grader never receives a Python object from a submission, only text that this
module turns into plain values: ``None``, ``bool``, ``int``, ``float``, ``complex``,
``str``, ``tuple``, ``list``, ``dict`` and NumPy arrays and scalars of boolean or
numeric dtype, rebuilt by the grader. A ``float`` subclass whose ``__eq__`` lies, an
ndarray subclass, or any other object cannot survive the trip: the encoder writes
the number it holds (``float(x)``, the array's bytes) or refuses.

The same file runs on both sides: the kernel agent executes its source, so it
imports only the standard library and NumPy.

Wire format: JSON (``NaN`` and ``Infinity`` allowed); a tagged object
``{"__t": TAG, ...}`` for what JSON lacks:

==========  ===============================================================
``tuple``   ``{"__t": "tuple", "v": [...]}``
``dict``    ``{"__t": "dict", "v": [[key, value], ...]}`` (any encodable key)
``nd``      ``{"__t": "nd", "dtype": "<f8", "shape": [...], "b64": ...}``
``np``      ``{"__t": "np", "dtype": "<f4", "b64": ...}`` (a NumPy scalar)
``complex`` ``{"__t": "complex", "re": x, "im": y}``
``obj``     ``{"__t": "obj", "cls": "pkg.mod:Name", "fields": {...}}`` (a
            dataclass; only the grader sends these, e.g. a ``hardware.GPU``)
==========  ===============================================================
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json

import numpy as np

#: dtype kinds an array may have: boolean, signed, unsigned, float, complex.
KINDS = "biufc"
#: Nesting deeper than this is refused (a cycle, or a hostile payload).
MAX_DEPTH = 64


class CodecError(TypeError):
    """A value that cannot be sent as data, or text that is not a valid encoding."""


def _dtype(text: object) -> np.dtype:
    if not isinstance(text, str):
        raise CodecError(f"dtype must be a string; got {type(text).__name__}")
    dtype = np.dtype(text)
    if dtype.kind not in KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CodecError(f"arrays must have a boolean or numeric dtype; got {text!r}")
    return dtype


def to_data(value: object, *, objects: bool = False, _depth: int = 0) -> object:
    """``value`` as JSON-ready data; ``objects`` allows dataclass instances (sent by the grader)."""
    if _depth > MAX_DEPTH:
        raise CodecError(f"values nest deeper than {MAX_DEPTH} levels")
    down = _depth + 1
    if value is None or type(value) in (bool, str):
        return value
    if isinstance(value, np.generic):
        return _scalar(value)
    if isinstance(value, int):
        return value if type(value) is int else int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        z = complex.__complex__(value)
        return {"__t": "complex", "re": z.real, "im": z.imag}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, np.ndarray):
        arr = np.array(np.asarray(value).view(np.ndarray), order="C", copy=True)  # keeps 0-d arrays 0-d
        dtype = _dtype(arr.dtype.str)
        return {"__t": "nd", "dtype": dtype.str, "shape": list(arr.shape),
                "b64": base64.b64encode(arr.tobytes()).decode("ascii")}
    if isinstance(value, tuple):
        return {"__t": "tuple", "v": [to_data(v, objects=objects, _depth=down) for v in tuple.__iter__(value)]}
    if isinstance(value, list):
        return [to_data(v, objects=objects, _depth=down) for v in list.__iter__(value)]
    if isinstance(value, dict):
        return {"__t": "dict", "v": [[to_data(k, objects=objects, _depth=down), to_data(v, objects=objects, _depth=down)]
                                     for k, v in dict.items(value)]}
    if objects and dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {f.name: to_data(getattr(value, f.name), objects=True, _depth=down)
                  for f in dataclasses.fields(value) if f.init}
        return {"__t": "obj", "cls": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    raise CodecError(f"cannot send a {type(value).__module__}.{type(value).__qualname__} as data; "
                     "return numbers, strings, NumPy arrays, or tuples, lists and dicts of them")


def _scalar(value: np.generic) -> dict:
    arr = np.asarray(value)
    dtype = _dtype(arr.dtype.str)
    return {"__t": "np", "dtype": dtype.str, "b64": base64.b64encode(arr.tobytes()).decode("ascii")}


def from_data(data: object, *, objects: object = False, _depth: int = 0) -> object:
    """The plain value that :func:`to_data` wrote; ``objects`` rebuilds dataclasses: ``True``
    (the kernel's side: the grader sent them) or a function ``(module, name) -> class`` that
    decides which classes may be rebuilt (the grader's side, for data from a kernel)."""
    if _depth > MAX_DEPTH:
        raise CodecError(f"values nest deeper than {MAX_DEPTH} levels")
    down = _depth + 1
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [from_data(v, objects=objects, _depth=down) for v in data]
    if type(data) is not dict:
        raise CodecError(f"unexpected {type(data).__name__} in the data")
    tag = data.get("__t")
    if tag == "tuple":
        return tuple(from_data(v, objects=objects, _depth=down) for v in _list(data, "v"))
    if tag == "dict":
        out = {}
        for pair in _list(data, "v"):
            if type(pair) is not list or len(pair) != 2:
                raise CodecError("dict items must be [key, value] pairs")
            key = from_data(pair[0], objects=objects, _depth=down)
            if isinstance(key, (list, dict, np.ndarray)):
                raise CodecError(f"unhashable dict key of type {type(key).__name__}")
            out[key] = from_data(pair[1], objects=objects, _depth=down)
        return out
    if tag == "complex":
        return complex(float(data["re"]), float(data["im"]))
    if tag in ("nd", "np"):
        dtype = _dtype(data.get("dtype"))
        raw = base64.b64decode(str(data.get("b64", "")), validate=True)
        if tag == "np":
            if len(raw) != dtype.itemsize:
                raise CodecError("a NumPy scalar's bytes do not match its dtype")
            return np.frombuffer(raw, dtype=dtype)[0].copy()
        shape = _list(data, "shape")
        if not all(type(n) is int and n >= 0 for n in shape):
            raise CodecError(f"an array shape must be non-negative ints; got {shape}")
        count = int(np.prod(shape, dtype=np.int64))
        if count * dtype.itemsize != len(raw):
            raise CodecError(f"an array of shape {tuple(shape)} and dtype {dtype} needs "
                             f"{count * dtype.itemsize} bytes; got {len(raw)}")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if tag == "obj" and objects:
        module, _, name = str(data.get("cls", "")).partition(":")
        if callable(objects):  # the grader's side: the callable checks the name before any import
            cls = objects(module, name)
        else:
            cls = importlib.import_module(module)
            for part in name.split("."):
                cls = getattr(cls, part)
        raw = data.get("fields", {})
        if type(raw) is not dict or not all(type(k) is str for k in raw):
            raise CodecError("an object's fields must be a dict with str keys")
        fields = {k: from_data(v, objects=objects, _depth=down) for k, v in raw.items()}
        return cls(**fields)
    raise CodecError(f"unknown tag {tag!r} in the data")


def _list(data: dict, key: str) -> list:
    value = data.get(key)
    if type(value) is not list:
        raise CodecError(f"{data.get('__t')!r}: {key!r} must be a list")
    return value


def dumps(value: object, *, objects: bool = False) -> str:
    """:func:`to_data` as JSON text."""
    return json.dumps(to_data(value, objects=objects), allow_nan=True, separators=(",", ":"))


def loads(text: str, *, objects: object = False) -> object:
    """:func:`from_data` of JSON text; raises :class:`CodecError` for anything else."""
    if not isinstance(text, str):
        raise CodecError(f"expected JSON text; got {type(text).__name__}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CodecError(f"not JSON: {exc}") from None
    return from_data(data, objects=objects)
