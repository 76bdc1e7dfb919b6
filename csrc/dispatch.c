/* dispatch.c -- the named kernel tables and the choice of the active one.
 * A family without a faster twin for an ISA reuses the best slower one, so every
 * table is complete. */
#include "cortiq.h"

static const cq_table TABLE_REF = {
    .name = "ref",
    .mathfn = &cq_mathfn_ref,
    .hash = &cq_hash_ref,
    .quant = &cq_quant_ref,
    .matvec = &cq_matvec_ref,
    .attn = &cq_attn_ref,
    .mix = &cq_mix_ref,
    .nystrom = &cq_nystrom_ref,
    .linalg = &cq_linalg_ref,
};

#ifdef CORTIQ_HAVE_AVX2
static const cq_table TABLE_AVX2 = {
    .name = "avx2",
    .mathfn = &cq_mathfn_avx2,
    .hash = &cq_hash_avx2,
    .quant = &cq_quant_avx2,
    .matvec = &cq_matvec_avx2,
    .attn = &cq_attn_avx2,
    .mix = &cq_mix_avx2,
    .nystrom = &cq_nystrom_avx2,
    .linalg = &cq_linalg_ref, /* no twin: once per seal */
};
#endif

#ifdef CORTIQ_HAVE_AVX512
/* AVX-512 twins exist only where they pay; the other families run their AVX2 code. */
static const cq_table TABLE_AVX512 = {
    .name = "avx512",
    .mathfn = &cq_mathfn_avx2,
    .hash = &cq_hash_avx2,
    .quant = &cq_quant_avx2,
    .matvec = &cq_matvec_avx512,
    .attn = &cq_attn_avx2,
    .mix = &cq_mix_avx2,
    .nystrom = &cq_nystrom_avx2,
    .linalg = &cq_linalg_ref, /* no twin: once per seal */
};
#endif

#ifdef CORTIQ_HAVE_NEON
static const cq_table TABLE_NEON = {
    .name = "neon",
    .mathfn = &cq_mathfn_neon,
    .hash = &cq_hash_neon,
    .quant = &cq_quant_neon,
    .matvec = &cq_matvec_neon,
    .attn = &cq_attn_neon,
    .mix = &cq_mix_neon,
    .nystrom = &cq_nystrom_neon,
    .linalg = &cq_linalg_ref, /* no twin: once per seal */
};
#endif

#ifdef CORTIQ_HAVE_NEON_DOTPROD
/* The dot product extension changes only the int8-activation matvec rows. */
static const cq_table TABLE_NEON_DOTPROD = {
    .name = "neon_dotprod",
    .mathfn = &cq_mathfn_neon,
    .hash = &cq_hash_neon,
    .quant = &cq_quant_neon,
    .matvec = &cq_matvec_neon_dotprod,
    .attn = &cq_attn_neon,
    .mix = &cq_mix_neon,
    .nystrom = &cq_nystrom_neon,
    .linalg = &cq_linalg_ref,
};
#endif

const cq_table *cq_table_for(cq_isa isa) {
    switch (isa) {
    case CQ_ISA_REF: return &TABLE_REF;
#ifdef CORTIQ_HAVE_AVX2
    case CQ_ISA_AVX2: return &TABLE_AVX2;
#endif
#ifdef CORTIQ_HAVE_AVX512
    case CQ_ISA_AVX512: return &TABLE_AVX512;
#endif
#ifdef CORTIQ_HAVE_NEON
    case CQ_ISA_NEON: return &TABLE_NEON;
#endif
#ifdef CORTIQ_HAVE_NEON_DOTPROD
    case CQ_ISA_NEON_DOTPROD: return &TABLE_NEON_DOTPROD;
#endif
    default: return 0;
    }
}

int cq_isa_usable(cq_isa isa) {
    uint32_t f = cq_cpu_features();
    if (!cq_table_for(isa)) return 0;
    switch (isa) {
    case CQ_ISA_REF: return 1;
    case CQ_ISA_AVX2: {
        uint32_t need = CQ_CPU_AVX | CQ_CPU_AVX2 | CQ_CPU_FMA | CQ_CPU_F16C | CQ_CPU_OS_YMM;
        return (f & need) == need;
    }
    case CQ_ISA_AVX512: {
        uint32_t need = CQ_CPU_AVX | CQ_CPU_AVX2 | CQ_CPU_FMA | CQ_CPU_F16C | CQ_CPU_OS_YMM |
                        CQ_CPU_AVX512F | CQ_CPU_AVX512BW | CQ_CPU_AVX512VL | CQ_CPU_AVX512DQ |
                        CQ_CPU_OS_ZMM;
        return (f & need) == need;
    }
    case CQ_ISA_NEON: return (f & CQ_CPU_ASIMD) != 0;
    case CQ_ISA_NEON_DOTPROD: return (f & (CQ_CPU_ASIMD | CQ_CPU_ASIMDDP)) == (CQ_CPU_ASIMD | CQ_CPU_ASIMDDP);
    default: return 0;
    }
}

cq_isa cq_isa_best(void) {
    if (cq_isa_usable(CQ_ISA_NEON_DOTPROD)) return CQ_ISA_NEON_DOTPROD;
    if (cq_isa_usable(CQ_ISA_NEON)) return CQ_ISA_NEON;
    if (cq_isa_usable(CQ_ISA_AVX512)) return CQ_ISA_AVX512;
    if (cq_isa_usable(CQ_ISA_AVX2)) return CQ_ISA_AVX2;
    return CQ_ISA_REF;
}

static const cq_table *ACTIVE = &TABLE_REF;

cq_status cq_set_isa(cq_isa isa) {
    if (!cq_isa_usable(isa)) return CQ_ERR_UNSUPPORTED;
    ACTIVE = cq_table_for(isa);
    return CQ_OK;
}

const cq_table *cq_active(void) { return ACTIVE; }

const char *cq_status_str(cq_status s) {
    switch (s) {
    case CQ_OK: return "ok";
    case CQ_ERR_SHAPE: return "inconsistent shapes";
    case CQ_ERR_ARG: return "argument out of range";
    case CQ_ERR_NOMEM: return "out of memory";
    case CQ_ERR_UNSUPPORTED: return "unsupported";
    default: return "unknown status";
    }
}

const char *cq_compiler(void) {
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#elif defined(_MSC_VER)
#define CQ_STR2(x) #x
#define CQ_STR(x) CQ_STR2(x)
    return "msvc " CQ_STR(_MSC_VER);
#else
    return "unknown";
#endif
}
