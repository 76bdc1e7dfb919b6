"""CMF v2 model files: reader, writer, quantizers (cortiq/cmf/quant.py is the layout spec)."""
