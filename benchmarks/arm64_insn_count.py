"""Instructions per weight of the matvec inner loops, NEON against the x86 twins, read
from the generated code (no arm64 hardware needed).

    python benchmarks/arm64_insn_count.py [--markdown]

Each ISA's matvec file is compiled with the flags setup.py gives it (aarch64-linux-gnu-gcc
for neon / neon_dotprod, gcc for avx2 / avx512) together with small probe functions that
call one row kernel for one dtype (everything inlined into the probe: flatten, constant
dtype). The probe's hot loop is its largest innermost loop in `objdump -d` (a backward
branch with no other loop inside); its instruction count divided by the weights one
iteration consumes (WEIGHTS below, read off the source of each loop) is the table's
number. Static counts: they say nothing of latency, ports or memory, only how much
work the decode + multiply-add of one weight takes.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
COMMON = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden",
          "-Wno-unused-function", "-I", CSRC]

# (ISA, compiler, objdump, flags, the file the probes include)
A64 = ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-objdump")
NEON_IMPL = '#include "matvec/matvec_neon_impl.h"\n'
AVX512_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"]
ISAS = {
    "neon": (*A64, ["-march=armv8-a"], "#define CQ_NEON_TABLE cq_matvec_neon\n" + NEON_IMPL),
    "neon_dotprod": (*A64, ["-march=armv8.2-a+dotprod"],
                     "#define CQ_NEON_SDOT 1\n#define CQ_NEON_TABLE cq_matvec_neon_dotprod\n"
                     + NEON_IMPL),
    "avx2": ("gcc", "objdump", ["-mavx2", "-mfma", "-mf16c"], '#include "matvec/matvec_avx2.c"\n'),
    "avx512": ("gcc", "objdump", AVX512_FLAGS, '#include "matvec/matvec_avx512.c"\n'),
}

# The row kernels as the matvec drivers call them: float32 x through dot_row (the AVX2
# table: dot_lanes, four rows side by side for the 8-lane dtypes), int8 x through
# i8_dot_rows. Per (ISA, kernel): the call and the weights one hot-loop iteration takes.
CALL_ROW = "float y; y = dot_row(&m, 0, x); return y;"
CALL_LANES = "float y[4]; dot_lanes(&m, 0, 1, 4, x, y); return y[0];"
CALL_I8 = "float y; i8_dot_rows(&m, 0, 1, xq, &y); return y;"
KERNELS = [  # label, dtype, act
    ("f32", "CQ_DT_F32", "exact"), ("f16", "CQ_DT_F16", "exact"), ("bf16", "CQ_DT_BF16", "exact"),
    ("q8_row", "CQ_DT_Q8_ROW", "exact"), ("q4_block", "CQ_DT_Q4_BLOCK", "exact"),
    ("q2tp", "CQ_DT_Q2TP", "exact"),
    ("q8_row", "CQ_DT_Q8_ROW", "int8"), ("q4_block", "CQ_DT_Q4_BLOCK", "int8"),
    ("q2tp", "CQ_DT_Q2TP", "int8"),
]
# weights per iteration of the probe's hot loop, from the source:
#   neon: CQ_NEON_DOT_STREAM and q8_dot take 16 columns a step; grouped_dot and the int8
#         rows one group of 32;
#   avx2: CQ_LANES8 64 columns x 4 rows; grouped_dot 8 q4_block groups (q2tp: 2); i8_row
#         2 groups, i8_row_q8 1, i8_row_q2 4;
#   avx512: q8_segment 64 columns; f32/f16/bf16 are AVX2's one-row CQ_DOT_STREAM (32);
#         q4_dot512 / q2_dot512 and the VNNI int8 rows as read off their loops.
WEIGHTS = {
    "neon": {"f32": 16, "f16": 16, "bf16": 16, "q8_row": 16, "q4_block": 32, "q2tp": 32,
             "q8_row/int8": 32, "q4_block/int8": 32, "q2tp/int8": 32},
    "avx2": {"f32": 256, "f16": 256, "bf16": 256, "q8_row": 256, "q4_block": 256, "q2tp": 64,
             "q8_row/int8": 32, "q4_block/int8": 64, "q2tp/int8": 128},
    "avx512": {"f32": 32, "f16": 32, "bf16": 32, "q8_row": 64, "q4_block": 128, "q2tp": 256,
               "q8_row/int8": 64, "q4_block/int8": 128, "q2tp/int8": 256},
}
WEIGHTS["neon_dotprod"] = WEIGHTS["neon"]


def probe_source(isa):
    src = [ISAS[isa][3],
           "#define P(name) __attribute__((flatten, noinline, used)) float probe_##name"
           + "(const cq_qmat *m0, const float *x, const cq_xq *xq)\n"]
    for label, dt, act in KERNELS:
        if act == "int8":
            call = CALL_I8
        elif isa == "avx2" and dt in ("CQ_DT_F32", "CQ_DT_F16", "CQ_DT_BF16", "CQ_DT_Q8_ROW"):
            call = CALL_LANES
        else:
            call = CALL_ROW
        src.append(f"P({label}_{act}) {{ cq_qmat m = *m0; m.dtype = {dt}; (void)xq; (void)x;"
                   f" {call} }}\n")
    return "".join(src)


LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
TARGET = re.compile(r"\b([0-9a-f]+) <")
BRANCH = re.compile(r"^(b|b\.\w+|cbn?z|tbn?z|j\w+)$")


def functions(objdump_text):
    """{name: [(address, mnemonic, operands)]} of the probe functions."""
    out, cur = {}, None
    for line in objdump_text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(probe_\w+)>:$", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        if re.match(r"^[0-9a-f]+ <", line):
            cur = None
            continue
        m = LINE.match(line)
        if cur is not None and m and not m.group(2).startswith("..."):
            cur.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


MAC = re.compile(r"^(fmla|fmls|sdot|udot|smlal2?|smull2?|sadalp|vfn?madd\w*|vpdpbusds?|vpmadd\w+)$")


def hot_loop(insns):
    """Instructions of the hot loop: of the innermost loops (a backward branch with no
    loop inside), the one with the most multiply-adds (then the longest)."""
    addrs = [a for a, _, _ in insns]
    loops = []
    for a, mn, ops in insns:
        if not BRANCH.match(mn) or mn in ("bl", "jmpq", "jmp") and "*" in ops:
            continue
        t = TARGET.search(ops)
        if not t:
            continue
        target = int(t.group(1), 16)
        if addrs[0] <= target <= a:
            loops.append((target, a))
    inner = [lp for lp in loops
             if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    if not inner:
        return 0

    def score(lp):
        body = [mn for a, mn, _ in insns if lp[0] <= a <= lp[1]]
        return (sum(1 for mn in body if MAC.match(mn)), len(body))

    return score(max(inner, key=score))[1]


def count(isa, tmp):
    cc, objdump, flags, _ = ISAS[isa]
    if not shutil.which(cc) or not shutil.which(objdump):
        return None
    c = os.path.join(tmp, f"probe_{isa}.c")
    o = c[:-2] + ".o"
    with open(c, "w") as f:
        f.write(probe_source(isa))
    subprocess.run([cc, *COMMON, *flags, "-c", c, "-o", o], check=True)
    dis = subprocess.run([objdump, "-d", "--no-show-raw-insn", o], check=True,
                         capture_output=True, text=True).stdout
    res = {}
    for name, insns in functions(dis).items():
        label, act = name[len("probe_"):].rsplit("_", 1)
        key = label if act == "exact" else f"{label}/int8"
        n = hot_loop(insns)
        res[key] = (n, WEIGHTS[isa][key])
    return res


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a docs/PERFORMANCE.md table")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = {isa: count(isa, tmp) for isa in ISAS}
    isas = [i for i in ISAS if results[i]]
    missing = [i for i in ISAS if not results[i]]
    keys = [k if act == "exact" else f"{k}/int8" for k, _, act in KERNELS]
    head = ["kernel"] + [f"{i} insn/weight (loop insns / weights)" for i in isas]
    rows = []
    for k in keys:
        row = [k.replace("/int8", " int8 x")]
        for i in isas:
            n, w = results[i][k]
            row.append(f"{n / w:.2f} ({n}/{w})")
        rows.append(row)
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(x[j]) for x in [head] + rows) for j in range(len(head))]
        for r in [head] + rows:
            print("  ".join(x.ljust(w) for x, w in zip(r, widths)))
    if missing:
        print(f"(not counted: {', '.join(missing)}: compiler or objdump missing)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
