"""Kernel names as a person reads them: the short name fleet shows by default, and a way to
tell apart two kernels whose short names are the same.

nsys and ncu write a kernel's demangled C++ name in full: return type, namespaces, template
arguments (PyTorch's run to 1,500 characters, lambdas inside lambdas) and parameter list. Nsight
Systems' "base name" and ncu's ``--print-kernel-base function`` drop the return type and the
parameters, and the templates too (``Kernel2``). fleet keeps the namespaces and the template
arguments, since they tell one instantiation from another (cuBLAS's CUTLASS ``Kernel2<..._nn_...>``
from ``Kernel2<..._nt_...>``), and shortens them only where the name would pass ``WIDTH``:

1. the return type and the parameter list go: ``void cutlass::Kernel2<X>(T1::Params)`` is
   ``cutlass::Kernel2<X>``;
2. past ``WIDTH``, integer casts go (``(int)4`` is ``4``, ``(bool)0`` ``false``, as ncu writes
   them), a chain of lambdas is ``[lambda]``, and the names inside the template's brackets lose
   their namespaces (``at::native::FillFunctor<float>`` is ``FillFunctor<float>``);
3. then the deepest brackets are emptied to ``<…>``, ``(…)``, one level at a time, down to the
   arguments of the kernel's own template;
4. then the name is cut, ``…`` and the brackets left open closed after it.

A name that is not a C++ signature (``sm80_xmma_gemm_...``, a Triton or mangled name) is kept
as it is, cut only past ``WIDTH``. Pure functions of the text, the standard library alone.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

WIDTH = 100  # characters of a short name, its tag included: a table row stays on one screen line
ELLIPSIS = "…"
MAX_LEVELS = 16  # bracket levels emptied one at a time; deeper ones go at once
OPEN, CLOSE = "<([", ">)]"

# Text whose brackets are not brackets, hidden (same length) before the name's structure is read:
# an operator's own symbol (``operator ()``, ``operator<<``), and the compilers' spellings of an
# anonymous namespace (nsys and ncu write ``<unnamed>``, c++filt ``(anonymous namespace)``).
_OPERATOR = re.compile(r"\boperator\s*(?:<=>|<<=|>>=|->\*|->|\(\)|\[\]|<<|>>|<=|>=|==|!=|&&|\|\||"
                       r"\+\+|--|[-+*/%^&|~!=<>,]=?|\s(?:new|delete)(?:\[\])?)")
_ATOMS = re.compile(r"<unnamed>|\(anonymous namespace\)|\[lambda\]")
_CAST = re.compile(r"\((?:(?:unsigned|signed) )?(?:char|short|int|long|long long|__int128|unsigned|"
                   r"(?:unsigned )?(?:short|int|long|long long)|size_t)\)(-?\d+)")
_BOOL = re.compile(r"\(bool\)([01])\b")
# A name's namespaces (``at::native::``), with the ``void`` of a function type before them.
_QUALIFIER = re.compile(r"(?<![\w:])(?:void (?=[A-Za-z_]))?(?:[A-Za-z_]\w*::)+(?=[A-Za-z_~])"
                        r"|(?<![\w:])void (?=[A-Za-z_])")
# A lambda, and the lambdas and call operators it holds: ``::[lambda() (instance 1)]::operator ()()
# const::[lambda(float) (instance 1)]`` is one lambda of the function before it.
_LAMBDAS = (re.compile(r"::\[lambda\b[^\]]*\](?:::operator \(\)\([^()]*\)(?: "
                       r"const)?::\[lambda\b[^\]]*\])*"))


def _masked(name: str) -> str:
    """``name`` with every character that only looks like a bracket made a letter."""
    out = list(name)
    for pattern in (_OPERATOR, _ATOMS):
        for m in pattern.finditer(name):
            out[m.start():m.end()] = "x" * (m.end() - m.start())
    return "".join(out)


def _depths(masked: str) -> list[int] | None:
    """The bracket depth before each character; None where the brackets do not pair up."""
    depth, out, stack = 0, [], []
    for c in masked:
        if c in CLOSE:
            if not stack or OPEN[CLOSE.index(c)] != stack[-1]:
                return None
            stack.pop()
            depth -= 1
        out.append(depth)
        if c in OPEN:
            stack.append(c)
            depth += 1
    return out if not stack else None


def base_name(name: str) -> str:
    """The name without its return type and parameter list, as Nsight's base name drops them
    (templates kept); a name that is not a C++ signature, as it is."""
    name = name.strip()
    masked = _masked(name)
    depths = _depths(masked)
    tail = re.search(r"\)(?:\s*(?:const|volatile|&&|&|noexcept))*\s*$", masked)
    if depths is None or tail is None:
        return name
    close = tail.start()
    if depths[close] != 0:
        return name
    # the "(" that ")" closes: the last one outside every bracket before it
    start = max(i for i in range(close) if masked[i] == "(" and depths[i] == 0)
    if start == 0 or masked[start - 1] in " \t":
        return name  # "(...)" alone, or after a space: words in brackets, not a parameter list
    head, masked_head = name[:start], masked[:start]
    spaces = [i for i, c in enumerate(masked_head) if c == " " and depths[i] == 0]
    # "void *f()": the "*" is the type's
    return head[spaces[-1] + 1:].lstrip("*&") if spaces else head


def _unqualified(name: str) -> str:
    """Inside the brackets, each name without its namespaces and a function type without its
    ``void``: ``Kernel<void at::native::f<float>(…)::[lambda]>`` is
    ``Kernel<f<float>(…)::[lambda]>``."""
    masked = _masked(name)
    depths = _depths(masked)
    if depths is None:
        return name
    drop = [m.span() for m in _QUALIFIER.finditer(masked) if depths[m.start()] >= 1]
    out, at = [], 0
    for start, end in drop:
        out.append(name[at:start])
        at = end
    return "".join(out) + name[at:]


def _collapse(name: str, level: int) -> str:
    """Every bracket nested ``level`` deep or deeper emptied: ``a<b<c>>`` at
    level 2 is ``a<b<…>>``."""
    masked = _masked(name)
    depths = _depths(masked)
    if depths is None:
        return name
    out = []
    for i, c in enumerate(name):
        d = depths[i]
        if masked[i] in OPEN and d == level - 1:
            out.append(c + ELLIPSIS)
        elif d < level:  # a bracket's close is at the depth of its open
            out.append(c)
    return "".join(out)


def _cut(name: str, width: int) -> str:
    """The longest beginning of ``name`` that, with ``…`` and its open brackets
    closed, fits ``width``."""
    masked = _masked(name)
    inside = {i for pattern in (_OPERATOR, _ATOMS) for m in pattern.finditer(name)
              for i in range(m.start() + 1, m.end())}
    stack: list[str] = []
    best = name[:max(width - 1, 0)] + ELLIPSIS
    for i, c in enumerate(masked):
        closers = "".join(CLOSE[OPEN.index(o)] for o in reversed(stack))
        # never within "[lambda]" or "operator<"
        if i + 1 + len(closers) <= width and i not in inside:
            best = name[:i].rstrip(" ,:") + ELLIPSIS + closers
        elif i > width:
            break
        if c in OPEN:
            stack.append(c)
        elif c in CLOSE and stack:
            stack.pop()
    return best


def short_name(name: str, width: int = WIDTH) -> str:
    """The name fleet shows for a kernel: its base name, shortened to ``width`` characters as
    the module says. Pure: the same name gives the same short name everywhere."""
    short = base_name(name)
    if len(short) <= width:
        return short
    short = _LAMBDAS.sub("::[lambda]", _BOOL.sub(lambda m: "true" if m.group(1) == "1" else "false",
                                                  _CAST.sub(r"\1", short)))
    if len(short) > width:
        short = _unqualified(short)
    depths = _depths(_masked(short))
    if depths is None:  # not C++ (or cut short by the tool): only its length is bounded
        return short if len(short) <= width else short[:width - 1] + ELLIPSIS
    # from the deepest level up (a hostile name's thousand levels: the first
    # pass empties all below 16)
    for level in range(min(max(depths, default=0), MAX_LEVELS), 1, -1):
        if len(short) <= width:
            return short
        short = _collapse(short, level)
    return short if len(short) <= width else _cut(short, width)


def tag(name: str, digits: int = 6) -> str:
    """A short, stable mark of a full name (the start of its SHA-1): the same kernel carries the
    same tag in every table, run and page."""
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:digits]


def short_names(names: Iterable[str], width: int = WIDTH) -> dict[str, str]:
    """Full name -> the name to show, for the names of one table. Where two full names would
    show the same short name, each gets `` #`` and its tag (``tag``), within ``width``: two
    kernels never look alike, and ``--json`` gives the same short name beside the full one."""
    names = list(dict.fromkeys(names))
    shown = {n: short_name(n, width) for n in names}
    by_short: dict[str, list[str]] = {}
    for n, s in shown.items():
        by_short.setdefault(s, []).append(n)
    for same in (group for group in by_short.values() if len(group) > 1):
        digits = 6
        while len({tag(n, digits) for n in same}) < len(same):
            digits += 2
        for n in same:
            mark = f" #{tag(n, digits)}"
            shown[n] = short_name(n, width - len(mark)) + mark
    return shown
