/* cpu.c -- which SIMD features this CPU has AND the OS has enabled.
 * x86: a CPUID bit alone is not enough: AVX registers are only usable when the OS saves
 * their state across context switches, which XCR0 (read with XGETBV) reports.
 * AArch64: Advanced SIMD is architectural; the dot product extension is what the OS
 * reports: HWCAP_ASIMDDP in the auxiliary vector on Linux, the FEAT_DotProd sysctl on
 * macOS (every Apple M-series core has it). */
#include "cortiq.h"

#if defined(__aarch64__) || defined(_M_ARM64)
#define CQ_ARM64 1
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
/* 1 or 0 as the sysctl says, -1 when this macOS does not have it */
static int sysctl_flag(const char *name) {
    int v = 0;
    size_t len = sizeof(v);
    if (sysctlbyname(name, &v, &len, NULL, 0) != 0) return -1;
    return v != 0;
}
#endif
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define CQ_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
static void cpuid(int leaf, int sub, unsigned r[4]) {
    int v[4];
    __cpuidex(v, leaf, sub);
    r[0] = (unsigned)v[0]; r[1] = (unsigned)v[1]; r[2] = (unsigned)v[2]; r[3] = (unsigned)v[3];
}
static unsigned long long xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void cpuid(int leaf, int sub, unsigned r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif
#endif

static uint32_t detect(void) {
    uint32_t f = 0;
#ifdef CQ_X86
    unsigned r[4];
    cpuid(0, 0, r);
    unsigned max_leaf = r[0];
    if (max_leaf < 1) return 0;
    cpuid(1, 0, r);
    unsigned ecx1 = r[2];
    if (ecx1 & (1u << 20)) f |= CQ_CPU_SSE42;
    if (ecx1 & (1u << 28)) f |= CQ_CPU_AVX;
    if (ecx1 & (1u << 12)) f |= CQ_CPU_FMA;
    if (ecx1 & (1u << 29)) f |= CQ_CPU_F16C;
    int osxsave = (ecx1 & (1u << 27)) != 0;
    if (osxsave) {
        unsigned long long xcr0 = xgetbv0();
        if ((xcr0 & 0x6) == 0x6) f |= CQ_CPU_OS_YMM;           /* XMM + YMM */
        if ((xcr0 & 0xE6) == 0xE6) f |= CQ_CPU_OS_ZMM;         /* + opmask, ZMM_Hi256, Hi16_ZMM */
    }
    if (max_leaf >= 7) {
        cpuid(7, 0, r);
        unsigned ebx7 = r[1], ecx7 = r[2];
        if (ebx7 & (1u << 5)) f |= CQ_CPU_AVX2;
        if (ebx7 & (1u << 16)) f |= CQ_CPU_AVX512F;
        if (ebx7 & (1u << 17)) f |= CQ_CPU_AVX512DQ;
        if (ebx7 & (1u << 30)) f |= CQ_CPU_AVX512BW;
        if (ebx7 & (1u << 31)) f |= CQ_CPU_AVX512VL;
        if (ecx7 & (1u << 11)) f |= CQ_CPU_AVX512VNNI;
        if (ecx7 & (1u << 1)) f |= CQ_CPU_AVX512VBMI;
        if (ecx7 & (1u << 8)) f |= CQ_CPU_GFNI;
        cpuid(7, 1, r);
        if (r[0] & (1u << 4)) f |= CQ_CPU_AVXVNNI;
    }
#endif
#ifdef CQ_ARM64
    f |= CQ_CPU_ASIMD;
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if (!(hw & HWCAP_ASIMD)) f &= ~(uint32_t)CQ_CPU_ASIMD; /* (a kernel that disabled it) */
    if (hw & HWCAP_ASIMDDP) f |= CQ_CPU_ASIMDDP;
#elif defined(__APPLE__)
    /* (macOS 11 has no FEAT_* keys; every arm64 Mac, M1 onwards, has the extension) */
    if (sysctl_flag("hw.optional.arm.FEAT_DotProd") != 0) f |= CQ_CPU_ASIMDDP;
#endif
#endif
    return f;
}

static uint32_t HIDDEN = 0; /* cq_hide_cpu_features: tests reach the fallbacks */

uint32_t cq_cpu_features(void) {
    static uint32_t cached = 0;
    static int done = 0;
    if (!done) {  /* benign race: every thread computes the same value */
        cached = detect();
        done = 1;
    }
    return cached & ~HIDDEN;
}

void cq_hide_cpu_features(uint32_t mask) { HIDDEN = mask; }

/* L1 data cache bytes: CPUID leaf 4 (Intel's deterministic cache parameters; recent
 * AMD parts answer it too), else AMD's leaf 0x80000005 (ECX[31:24] KiB), else 32 KiB.
 * Clamped to 16-256 KiB against odd hypervisor answers. */
static size_t detect_l1d(void) {
    size_t bytes = 0;
#ifdef CQ_X86
    unsigned r[4];
    cpuid(0, 0, r);
    if (r[0] >= 4) {
        for (int sub = 0; sub < 16 && !bytes; sub++) {
            cpuid(4, sub, r);
            const unsigned type = r[0] & 31u, level = (r[0] >> 5) & 7u;
            if (type == 0) break; /* no more caches */
            if (level == 1 && (type == 1 || type == 3)) /* data or unified */
                bytes = (size_t)((r[1] >> 22) + 1) * (((r[1] >> 12) & 1023u) + 1) * ((r[1] & 4095u) + 1) * ((size_t)r[2] + 1);
        }
    }
    if (!bytes) {
        cpuid((int)0x80000000u, 0, r);
        if (r[0] >= 0x80000005u) {
            cpuid((int)0x80000005u, 0, r);
            bytes = (size_t)(r[2] >> 24) * 1024;
        }
    }
#endif
    if (!bytes) bytes = 32768;
    return bytes < 16384 ? 16384 : bytes > 262144 ? 262144 : bytes;
}

size_t cq_l1d_bytes(void) {
    static size_t cached = 0; /* benign race, as above */
    if (!cached) cached = detect_l1d();
    return cached;
}
