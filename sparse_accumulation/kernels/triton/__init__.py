"""The Triton backend's parts: source generation, launch configurations, building and launching kernels.

:mod:`sparse_accumulation.kernels.triton_gpu` puts them together into the kernel contract.
"""
