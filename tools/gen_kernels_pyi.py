"""Write src/cortiq/kernels/_kernels.pyi from the Cython sources (run after adding a kernel).

    python tools/gen_kernels_pyi.py

Reads every top-level `def` of src/cortiq/kernels/_kernels.pyx and its _k_*.pxi includes and the
methods of their `cdef class`es, maps the C argument types to Python ones (size_t,
int -> int; float, double -> float; bint -> bool; cnp.ndarray -> np.ndarray) and
types everything else as Any: the kernels check their arrays at run time.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "cortiq" / "kernels"
C_TYPES = {"size_t": "int", "int": "int", "long": "int", "Py_ssize_t": "int",
           "float": "float", "double": "float", "bint": "bool", "str": "str",
           "list": "list", "cnp.ndarray": "np.ndarray", "QMat": "QMat", "object": "Any"}


def _signature(text: str) -> str:
    """'name(args):' -> 'name(args) -> Any' with Python annotations."""
    name, _, rest = text.partition("(")
    args = rest.rsplit(")", 1)[0]
    out = []
    for a in (x.strip() for x in _split(args)):
        if not a:
            continue
        if a in ("*", "self") or a.startswith("*"):
            out.append(a)
            continue
        default = ""
        if "=" in a:
            a = a.split("=", 1)[0]
            default = " = ..."
            a = a.strip()
        parts = a.split()
        if len(parts) == 2 and parts[0] in C_TYPES:
            out.append(f"{parts[1]}: {C_TYPES[parts[0]]}{default}")
        else:
            out.append(f"{parts[-1]}: Any{default}")
    return f"{name.strip()}({', '.join(out)}) -> Any"


def _split(args: str):
    depth, cur = 0, ""
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            yield cur
            cur = ""
        else:
            cur += ch
    yield cur


def _defs(src: str, indent: str):
    """Full (multi-line) `def` headers at `indent`."""
    pat = re.compile(rf"^{indent}def (.*?\)):", re.DOTALL | re.MULTILINE)
    for m in pat.finditer(src):
        yield " ".join(m.group(1).split())


def main() -> int:
    files = [ROOT / "_kernels.pyx", *sorted(ROOT.glob("_k_*.pxi"))]
    lines = ['"""Type stubs of cortiq.kernels._kernels (written by tools/gen_kernels_pyi.py)."""',
             "from typing import Any", "", "import numpy as np", ""]
    for f in files:
        src = f.read_text()
        # top level: only what is not inside a class
        body = re.sub(r"^cdef class .*?(?=^\S)", "", src, flags=re.DOTALL | re.MULTILINE)
        for name in re.findall(r"^([A-Z][A-Z0-9_]*)\s*=", body, re.MULTILINE):
            lines.append(f"{name}: Any")
        for d in _defs(body, ""):
            lines.append(f"def {_signature(d)}: ...")
        for m in re.finditer(r"^cdef class (\w+).*?:\n(.*?)(?=^\S|\Z)", src, re.DOTALL | re.MULTILINE):
            cls, cbody = m.group(1), m.group(2)
            lines += ["", f"class {cls}:"]
            for attr in re.findall(r"^    cdef (?:readonly|public) (\w+(?:\.\w+)?) ([\w, ]+)$",
                                   cbody, re.MULTILINE):
                for n in attr[1].split(","):
                    lines.append(f"    {n.strip()}: {C_TYPES.get(attr[0], 'Any')}")
            props = set(re.findall(r"^    @property\n    def (\w+)", cbody, re.MULTILINE))
            seen = set()
            for d in _defs(cbody, "    "):
                n = d.split("(")[0]
                if n in props:
                    if n not in seen:
                        lines += ["    @property", f"    def {n}(self) -> Any: ..."]
                        seen.add(n)
                    elif "," in d:                 # the second def: its setter
                        lines += [f"    @{n}.setter", f"    def {n}(self, value: Any) -> None: ..."]
                    continue
                sig = _signature(d).replace(" -> Any", " -> None") if n == "__init__" \
                    else _signature(d)
                lines.append(f"    def {sig}: ...")
            lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    (ROOT / "_kernels.pyi").write_text(text)
    print(f"wrote {ROOT / '_kernels.pyi'} ({text.count('def ')} functions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
