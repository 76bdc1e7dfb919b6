/* matvec_neon_dotprod.c -- the NEON matvec table for CPUs with the dot product
 * extension (armv8.2-a+dotprod: sdot), which forms the int8-activation rows' integer
 * sums; everything else is matvec_neon.c's code (matvec_neon_impl.h). */
#if !defined(__ARM_FEATURE_DOTPROD)
#error "matvec_neon_dotprod.c needs -march=armv8.2-a+dotprod"
#endif
#define CQ_NEON_SDOT 1
#define CQ_NEON_TABLE cq_matvec_neon_dotprod
#include "matvec_neon_impl.h"
