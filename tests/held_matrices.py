"""The kernel matrices a model object holds, found by walking its attributes: what a
model's own `matrices()` list is checked against (a matrix it forgets would keep the
process-default precision when `set_precision` is called)."""
from __future__ import annotations

from cortiq.kernels import _kernels


def held_matrices(model) -> list:
    """The distinct QMat objects reachable from `model` through attributes, slots and
    containers of cortiq's own classes."""
    out, seen, stack = [], set(), [model]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, _kernels.QMat):
            out.append(o)
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif type(o).__module__.startswith("cortiq.") and not isinstance(o, type):
            stack.extend(vars(o).values() if hasattr(o, "__dict__") else ())
            for cls in type(o).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if hasattr(o, slot):
                        stack.append(getattr(o, slot))
    return out
