"""Our kernels' host side: compile and launch (runtime), checked launches, and the NumPy specification."""
