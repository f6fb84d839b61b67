"""The operations, one folder each, with the same files in each:

* ``api.py``: the public function (validation in the caller's words, dispatch);
* ``registered.py``: the registered ops ``torch.ops.sparse_accumulation.*`` (fake implementations, autograd,
  what ``torch.compile`` and ``torch.export`` see);
* ``eager.py``: the same kernels and gradients through ``torch.autograd.Function`` s, without the dispatcher
  (plain eager calls: :func:`.dispatch.eager_applies`);
* ``derivatives.py`` where the gradient formulas are shared by the two paths.

Operations: :mod:`.accumulate` (sparse accumulation), :mod:`.graph` (message passing), :mod:`.polynomial`
(element-weighted polynomials) and :mod:`.pair_sums` (HIP-NN's interaction sums). Importing this package
registers every op. :mod:`.activations` (SiLU with a fused second derivative) is an autograd function only.
"""
from .accumulate import registered as _accumulate  # noqa: F401  (registers the ops)
from .graph import registered as _graph  # noqa: F401
from .pair_sums import registered as _pair_sums  # noqa: F401
from .polynomial import registered as _polynomial  # noqa: F401
