# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The one extension module: typed wrappers over the C kernels of csrc/.

Each wrapper checks shapes and dtypes while holding the GIL, releases it around the
C call, and turns a failing status into KernelError("operation: reason"). The
dispatch table is chosen once, at import (see src/cortiq/kernels/_config.py for CORTIQ_ISA).
Kernel families live in the included .pxi files, one per family.
"""
import numpy as np
cimport numpy as cnp
from cortiq.errors import KernelError

cnp.import_array()

include "_k_dispatch.pxi"
include "_k_mathfn.pxi"
include "_k_hash.pxi"
include "_k_quant.pxi"
include "_k_matvec.pxi"
include "_k_attn.pxi"
include "_k_dory.pxi"
include "_k_llama.pxi"
include "_k_mix.pxi"
include "_k_nystrom.pxi"
include "_k_linalg.pxi"
