"""Argument checks shared by the indexes and the tracker.

Every public entry point validates before it mutates, so bad input raises a
``TypeError``/``ValueError`` and leaves the structure as it was.
"""

from __future__ import annotations

import array
import math
import operator
import sys
from typing import Any, Iterable, SupportsIndex, cast

#: Ledger and entry ids are non-negative int64 (Pulsar's ``long``).
MAX_ID = (1 << 63) - 1
#: Due times are below 2^62 ms (146 million years): a ceil-rounded bucket
#: then still fits an int64 and ``pop_due`` can always reach it.
MAX_DUE = (1 << 62) - 1
#: A default delay (the tracker's and ``subscribe``'s ``delay_ms``, a built-in
#: backoff's bounds) is at most half the due-time range, 2^61 - 1 ms (73
#: million years): every nack that uses it stays in range while the clock
#: reads below 2^61 ms. An explicit ``add(delay_ms=...)`` is checked against
#: the clock at the call instead.
MAX_DEFAULT_DELAY = MAX_DUE >> 1
#: The longest delay pulsar-client holds (a retry letter's ``deliver_after``): a C ``int`` of ms, 24.8 days.
MAX_CLIENT_DELAY_MS = (1 << 31) - 1
#: Entry ids below this fit a 32-bit Roaring bitmap.
U32 = 1 << 32


def check_int(name: str, value: object, maximum: int = MAX_ID) -> int:
    """Return ``value`` as a non-negative ``int`` no larger than ``maximum``.

    Accepts ``int`` and integer-like objects (numpy integers) but never
    ``bool``, floats, strings or ``None``.
    """
    if type(value) is not int:
        if isinstance(value, bool) or isinstance(value, float) or value is None:
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        try:
            value = operator.index(cast(SupportsIndex, value))
        except TypeError:
            raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def message_id(item: object) -> tuple[int, int] | None:
    """``item`` as a ``(ledger_id, entry_id)`` tuple of ids :func:`check_int`
    accepts, or None when it is not one (what ``in`` answers False for): the
    indexes' ``__contains__`` agree on ``bool``, numpy integers and negatives."""
    if not isinstance(item, tuple) or len(item) != 2:
        return None
    try:
        return check_int("ledger_id", item[0]), check_int("entry_id", item[1])
    except (TypeError, ValueError):
        return None


def check_delay_ms(name: str, value: object) -> int:
    """Return a delay in whole milliseconds (floats are rounded up).

    Rejects ``bool``, NaN, infinities, negatives and non-numbers.
    """
    if type(value) is int:
        if value < 0:
            raise ValueError(f"{name} must be >= 0 ms, got {value}")
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{name} must be a finite number of ms, got {value}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0 ms, got {value}")
        return math.ceil(value)
    return check_int(name, value)


def check_default_delay(name: str, value: object) -> int:
    """:func:`check_delay_ms`, and at most :data:`MAX_DEFAULT_DELAY`: a delay
    given once for every later nack is refused where it is given, not at
    each nack that would use it."""
    delay = check_delay_ms(name, value)
    if delay > MAX_DEFAULT_DELAY:
        raise ValueError(f"{name} must be <= {MAX_DEFAULT_DELAY} ms, got {delay}")
    return delay


def check_client_delay(name: str, value: object) -> int:
    """:func:`check_delay_ms`, and at most :data:`MAX_CLIENT_DELAY_MS`: a delay
    handed to pulsar-client, refused where it is given (the client itself
    would fail with an ``OverflowError`` deep inside a publish)."""
    delay = check_delay_ms(name.split(" ")[0], value)
    if delay > MAX_CLIENT_DELAY_MS:
        raise ValueError(f"{name} must be <= {MAX_CLIENT_DELAY_MS} ms (the longest delay the client holds: a C int "
                         f"of ms, 24.8 days), got {delay}")
    return delay


def _from_numpy(ids: Any) -> array.array[int]:
    np = sys.modules["numpy"]
    if ids.ndim != 1:
        raise ValueError(f"entry_ids must be one-dimensional, got shape {ids.shape}")
    kind = ids.dtype.kind
    if kind not in "iu":
        raise TypeError(f"entry_ids must hold integers, not dtype {ids.dtype}")
    out = array.array("I")
    if ids.size == 0:
        return out
    if kind == "i" and ids.min() < 0:
        raise ValueError("entry ids must be >= 0")
    top = int(ids.max())
    if top > MAX_ID:
        raise ValueError(f"entry ids must be <= {MAX_ID}, got {top}")
    if top >= U32:
        out = array.array("Q")
        out.frombytes(np.ascontiguousarray(ids, dtype=np.uint64).tobytes())
    else:
        out.frombytes(np.ascontiguousarray(ids, dtype=np.uint32).tobytes())
    return out


def _from_signed_array(ids: array.array[int]) -> array.array[int]:
    # A C-level conversion rejects negatives (OverflowError) without a Python loop.
    try:
        return array.array("I", ids)
    except OverflowError:
        pass
    try:
        wide = array.array("Q", ids)
    except OverflowError:
        raise ValueError("entry ids must be >= 0") from None
    return _check_wide(wide)


def _check_wide(wide: array.array[int]) -> array.array[int]:
    if len(wide) and max(wide) > MAX_ID:
        raise ValueError(f"entry ids must be <= {MAX_ID}")
    return wide


def entry_array(ids: object) -> array.array[int]:
    """Convert ``entry_ids`` to ``array('I')`` (all < 2^32) or ``array('Q')``.

    Fast paths (no per-element Python code): ``array.array`` of any integer
    typecode and numpy integer arrays. Other iterables are checked element by
    element in C (``bool``/float/None/negative/too large are rejected).
    """
    if isinstance(ids, array.array):
        tc = ids.typecode
        if str(tc) in "fduw":  # floats and characters ("w": Python 3.13's wchar)
            raise TypeError(f"entry_ids array must hold integers, not typecode {tc!r}")
        if tc in "IL" and ids.itemsize == 4:
            return ids if tc == "I" else array.array("I", ids.tobytes())
        if tc in "QL" and ids.itemsize == 8:
            wide = array.array("Q")
            wide.frombytes(ids.tobytes())
            return _from_signed_array(wide) if len(wide) and max(wide) < U32 else _check_wide(wide)
        return _from_signed_array(ids)
    if type(ids).__module__ == "numpy" and hasattr(ids, "dtype"):
        return _from_numpy(ids)
    if isinstance(ids, (str, bytes, bytearray, memoryview, dict)) or ids is None:
        raise TypeError(f"entry_ids must be an iterable of ints, not {type(ids).__name__}")
    try:
        seq = ids if isinstance(ids, (list, tuple)) else list(cast(Iterable[Any], ids))
    except TypeError:
        raise TypeError(f"entry_ids must be an iterable of ints, not {type(ids).__name__}") from None
    for t in set(map(type, seq)):
        if t is bool or not (issubclass(t, int) or hasattr(t, "__index__")):
            raise TypeError(f"entry ids must be ints, not {t.__name__}")
    try:
        return array.array("I", seq)
    except OverflowError:
        pass
    try:
        return _check_wide(array.array("Q", seq))
    except OverflowError:
        raise ValueError(f"entry ids must be between 0 and {MAX_ID}") from None
