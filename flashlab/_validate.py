"""Input checks shared by the package: errors that name the argument, what was
expected and what came."""

from __future__ import annotations

import numpy as np


def as_float_array(
    name: str, x: object, dtype: type = np.float64, min_ndim: int = 1, allow_neg_inf: bool = False
) -> np.ndarray:
    """Convert ``x`` to a floating array of ``dtype``; reject non-numeric data,
    too few dimensions and non-finite values (NaN, +-inf; -inf is allowed, as a
    masked entry, when ``allow_neg_inf``)."""
    try:
        arr = np.asarray(x)
    except Exception as exc:  # pragma: no cover - numpy raises many types here
        raise ValueError(f"{name} must be array-like of numbers; got {type(x).__name__}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{name} must hold real numbers; got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real; got complex dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {arr.shape}")
    arr = arr.astype(dtype, copy=False)
    bad_mask = np.isnan(arr) | np.isposinf(arr) if allow_neg_inf else ~np.isfinite(arr)
    if np.any(bad_mask):
        bad = tuple(int(i) for i in np.argwhere(bad_mask)[0])
        allowed = "finite or -inf (a masked entry)" if allow_neg_inf else "finite"
        raise ValueError(f"{name} must be {allowed}; found {arr[bad]} at index {bad}")
    return arr


def positive_int(name: str, value: object) -> int:
    """``value`` as an int >= 1, or a ValueError that says what came."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= 1; got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {value}")
    return int(value)


def positive_float(name: str, value: object) -> float:
    """``value`` as a finite float > 0, or a ValueError that says what came."""
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a positive number; got {value!r}") from exc
    if not np.isfinite(out) or out <= 0:
        raise ValueError(f"{name} must be a positive finite number; got {value!r}")
    return out
