"""Portable kernels in plain torch (any device), one module per operation: :mod:`.accumulate`, :mod:`.graph`,
:mod:`.polynomial`, :mod:`.pair_sums`. They also serve every operation on devices without a faster backend,
and the reference implementation names of the operations that have no references of their own."""
