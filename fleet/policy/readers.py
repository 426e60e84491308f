"""Reading a node's JSON into types: each value of its type, or absent (None, or an empty tuple).

What the node state (``nodestate``) and the agent's other answers (``fleet/agent/messages.py``)
read a node's document with, so that a value of another type never reaches a field. Pure and
Python 3.8: it travels to the nodes with the policy.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

__all__ = ["is_int", "int_of", "str_of", "number_of", "bool_of", "ints_of", "strs_of", "dict_of",
           "dicts_of"]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_of(v: Any) -> Optional[int]:
    return v if is_int(v) else None


def str_of(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def number_of(v: Any) -> Optional[float]:
    """A finite number of a size a node could mean (as the wire's shapes
    hold numbers), else None."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) < 1e15
    return v if ok else None


def bool_of(v: Any) -> Optional[bool]:
    return v if isinstance(v, bool) else None


def ints_of(v: Any) -> Tuple[int, ...]:
    return tuple(i for i in v if is_int(i)) if isinstance(v, list) else ()


def strs_of(v: Any) -> Tuple[str, ...]:
    return tuple(s for s in v if isinstance(s, str)) if isinstance(v, list) else ()


def dict_of(v: Any) -> Dict[str, Any]:
    return v if isinstance(v, dict) else {}


def dicts_of(v: Any) -> List[Dict[str, Any]]:
    return [d for d in v if isinstance(d, dict)] if isinstance(v, list) else []
