"""CPU kernels with numba, one module per operation (:mod:`.accumulate`, :mod:`.graph`, :mod:`.polynomial`,
:mod:`.pair_sums`), and what they share: the one thread pool (:mod:`.threads`), and the block steps of the
sparse accumulation's kernel (:mod:`.accumulate_kernel`, :mod:`.blocks`, :mod:`.prefetch`,
:mod:`.transpose`). The kernels are serial functions that release the GIL, compiled on first use per dtype and
cached on disk by numba."""
