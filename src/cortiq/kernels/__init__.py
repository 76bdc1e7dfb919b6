"""The Cython boundary (`_kernels`: the C kernels, argument checks, GIL released),
QTensor (`tensor`: a stored matrix multiplied from its CMF payload) and the
process-wide settings (`_config`: ISA, threads, precision)."""
