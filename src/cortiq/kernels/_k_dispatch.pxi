# Dispatch, CPU features and threads.

_ISA_BY_NAME = {"ref": CQ_ISA_REF, "avx2": CQ_ISA_AVX2, "avx512": CQ_ISA_AVX512,
                "neon": CQ_ISA_NEON, "neon_dotprod": CQ_ISA_NEON_DOTPROD}

_FEATURE_NAMES = (
    (0, "sse4.2"), (1, "avx"), (2, "avx2"), (3, "fma"), (4, "f16c"), (5, "avx512f"),
    (6, "avx512bw"), (7, "avx512vl"), (8, "avx512dq"), (9, "avx512vnni"),
    (10, "avxvnni"), (11, "os-ymm"), (12, "os-zmm"), (13, "avx512vbmi"),
    (14, "asimd"), (15, "asimddp"), (16, "gfni"),
)


cdef inline void check(cq_status st, str op) except *:
    if st != CQ_OK:
        raise KernelError(f"{op}: {cq_status_str(st).decode()}")


def cpu_features():
    """Names of the SIMD features this CPU reports and the OS enables."""
    cdef uint32_t f = cq_cpu_features()
    return [name for bit, name in _FEATURE_NAMES if f & (1u << bit)]


def l1d_bytes():
    """Bytes of L1 data cache (CPUID; 32 KiB when the CPU does not say): the wide-row
    kernels size their x chunks by it."""
    return cq_l1d_bytes()


def _hide_cpu_features(names):
    """Tests only: report these features as absent (an empty list restores)."""
    cdef uint32_t mask = 0
    known = {name: bit for bit, name in _FEATURE_NAMES}
    for n in names:
        if n not in known:
            raise ValueError(f"unknown cpu feature {n!r}; known: {', '.join(known)}")
        mask |= 1u << known[n]
    cq_hide_cpu_features(mask)


def compiled_isas():
    """ISA tables compiled into this build, in order of preference (worst first)."""
    return [n for n, v in _ISA_BY_NAME.items() if cq_table_for(v) != NULL]


def usable_isas():
    """Compiled ISAs that this CPU and OS can run."""
    return [n for n, v in _ISA_BY_NAME.items() if cq_isa_usable(v)]


def best_isa():
    """The ISA import would choose without CORTIQ_ISA."""
    return _name_of(cq_isa_best())


cdef str _name_of(cq_isa isa):
    for n, v in _ISA_BY_NAME.items():
        if v == isa:
            return n
    return "?"


def set_isa(str name):
    """Make a table active. Raises ValueError naming the valid choices."""
    if name not in _ISA_BY_NAME or not cq_isa_usable(_ISA_BY_NAME[name]):
        raise ValueError(
            f"ISA {name!r} is not available here; valid choices: {', '.join(usable_isas())}"
            f" (compiled: {', '.join(compiled_isas())})")
    check(cq_set_isa(_ISA_BY_NAME[name]), "set_isa")


def active_isa():
    return cq_active().name.decode()


def pool_workers():
    """Worker threads the kernel pool has started (threads - 1 once a parallel kernel
    has run; 0 before)."""
    return cq_pool_workers()


def pool_stalls():
    """Parallel calls that found a pool worker descheduled by the OS (cores shared with
    other busy threads); after each, calls run on their caller alone for a while."""
    return cq_pool_stalls()


def pool_spin_us():
    return cq_pool_spin_us()


def set_pool_spin_us(int us):
    if us < 0:
        raise ValueError(f"set_pool_spin_us: us must be >= 0, got {us}")
    cq_pool_set_spin_us(us)


def set_num_threads(int n):
    if n < 1:
        raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
    cq_set_num_threads(n)


def get_num_threads():
    return cq_get_num_threads()


# Precision of the activations (docs/ARCHITECTURE.md, "int8 activations"): each QMat
# has its own (cq_qmat.act, set before every call); one that follows the process
# default (precision None: what LLM() gives its matrices unless told) reads this.
PRECISIONS = ("exact", "int8", "auto")
cdef int _PREC_DEFAULT = 2  # index into PRECISIONS


def set_default_precision(str p):
    """The precision of every matrix whose own precision is None."""
    global _PREC_DEFAULT
    if p not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {p!r}")
    _PREC_DEFAULT = PRECISIONS.index(p)


def get_default_precision():
    return PRECISIONS[_PREC_DEFAULT]


def compiler():
    return cq_compiler().decode()
