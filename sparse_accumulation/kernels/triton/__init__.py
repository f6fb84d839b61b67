"""Triton kernels (CUDA; CPU tensors under ``TRITON_INTERPRET=1``), one module per operation
(:mod:`.accumulate`, :mod:`.graph`, :mod:`.polynomial`, :mod:`.pair_sums`), and what they share: source
generation (:mod:`.codegen` and one generator per operation), launch configurations (:mod:`.configs`),
building (:mod:`.build`) and launching (:mod:`.launch`) the generated kernels.
"""
