"""The bucket arithmetic: which bucket time a due time maps to.

Every place that computes a bucket (the index, the tracker's timer, the
consumer's delivery core, the planner's pending model) asks a
:class:`Precision`; only the reference models the tests compare the index
against (:mod:`nacktracker.index.baselines`) write the rule out on their own,
from its definition, so that a mistake here cannot hide in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ._checks import check_int

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Precision", "ROUNDINGS", "MAX_BITS"]

#: ``"floor"``: a bucket is the due time with its low bits cleared (Pulsar's
#: ``negativeAckPrecisionBitCnt``: up to 2^bits - 1 ms early, never late);
#: ``"ceil"``: rounded up to the next multiple (never early, up to 2^bits - 1 ms late).
ROUNDINGS: Final = ("floor", "ceil")
#: Buckets of up to 2^30 ms (12 days).
MAX_BITS: Final = 30


@dataclass(frozen=True, slots=True)
class Precision:
    """Buckets of ``2^bits`` ms, rounded ``"floor"`` or ``"ceil"``.

    A due time maps to its bucket as ``(due + add) & mask``: ``add`` is 0
    for floor and ``2^bits - 1`` for ceil, ``mask`` clears the low ``bits``.
    Make one with :meth:`of` (validated; one shared object per precision).

    >>> Precision.of(3).bucket(17), Precision.of(3, "ceil").bucket(17), Precision.of(3, "ceil").bucket(16)
    (16, 24, 16)
    """

    bits: int
    rounding: str
    add: int
    mask: int

    @classmethod
    def of(cls, bits: object, rounding: object = "floor") -> Precision:
        """The precision of ``bits`` (an int in ``[0, 30]``) and ``rounding``
        (``"floor"`` or ``"ceil"``); ``TypeError``/``ValueError`` otherwise.
        Runtime: O(1) (one object per precision and rounding, shared: an
        index does not hold its own int objects)."""
        width_bits = check_int("precision_bits", bits, MAX_BITS)
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {rounding!r}")
        key = (width_bits, str(rounding))
        made = _MADE.get(key)
        if made is None:
            width = 1 << width_bits
            made = _MADE[key] = cls(width_bits, key[1], 0 if rounding == "floor" else width - 1, ~(width - 1))
        return made

    @property
    def width(self) -> int:
        """Milliseconds per bucket."""
        return 1 << self.bits

    def bucket(self, due_ms: int) -> int:
        """The bucket time of a due time (ms, >= 0). Runtime: O(1)."""
        return (due_ms + self.add) & self.mask

    def buckets(self, due_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`bucket` of each due time of an int64 array. Runtime: O(n) in C."""
        return (due_ms + self.add) & self.mask


_MADE: dict[tuple[int, str], Precision] = {}
