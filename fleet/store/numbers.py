"""Numbers read from the store's files (manifests, summaries the nodes wrote), within bounds.

A node, a job or a hand edit can write any number: ``1e400`` reads as infinity, and ``int()``
of that raises OverflowError; a count past 2**63 does not fit SQLite's INTEGER. Every number
the store keeps or indexes is parsed here, and one out of bounds is a ValueError that names
it, which the reader turns into "this file is left out", never a traceback."""

from __future__ import annotations

import math

INTEGER_MAX = 2 ** 63 - 1   # SQLite's INTEGER
REAL_MAX = 1e300            # far past any time or byte count; anything larger is a damaged value


def _parsed(value: object, what: str) -> float | int:
    if isinstance(value, bool):
        raise ValueError(f"{what} is {value!r}, not a number")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        text = value.strip().replace(",", "")  # ncu writes thousands separators in some locales
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                pass
    raise ValueError(f"{what} is {value!r:.40}, not a number")


def real(value: object, what: str) -> float:
    """A finite number of at most REAL_MAX in size."""
    number = _parsed(value, what)
    if isinstance(number, int):
        if abs(number) > REAL_MAX:
            raise ValueError(f"{what} is {str(number)[:40]}, past {REAL_MAX:g}")
        return float(number)
    if not math.isfinite(number) or abs(number) > REAL_MAX:
        raise ValueError(f"{what} is {value!r:.40}, past {REAL_MAX:g}")
    return number


def count(value: object, what: str) -> int:
    """A number from 0 to INTEGER_MAX, whole (a fraction, as ``int()`` did, is cut off)."""
    number = _parsed(value, what)
    if isinstance(number, float):
        if not math.isfinite(number) or not 0 <= number <= INTEGER_MAX:
            raise ValueError(f"{what} is {value!r:.40}, not from 0 to {INTEGER_MAX}")
        number = int(number)
    if not 0 <= number <= INTEGER_MAX:
        raise ValueError(f"{what} is {str(number)[:40]}, not from 0 to {INTEGER_MAX}")
    return number
