"""Our kernels: each family's *.cu source beside its host module, runtime (compile, launch), the NumPy spec.

Every launch wrapper checks shapes and dtypes (`runtime.check`) and launches on the current stream with
outputs and scratch passed in, so a whole decode or verify step can be captured once as a CUDA graph.
"""
