/* matvec_neon.c -- NEON twin of matvec_ref.c for every AArch64 CPU (armv8-a); the row
 * kernels are matvec_neon_impl.h's. */
#define CQ_NEON_TABLE cq_matvec_neon
#include "matvec_neon_impl.h"
