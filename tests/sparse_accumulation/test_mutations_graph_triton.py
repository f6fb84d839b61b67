"""``gradgradcheck`` of every message-passing pattern on the Triton graph kernels (interpreted on the CPU
without a GPU, ``interpreted.py``): the patterns of ``test_mutations_graph.py``, fast mode (random projections
of the Jacobians), in the slow selection (the interpreter takes seconds per pattern)."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

import sparse_accumulation as sa  # noqa: E402
from graph_helpers import PATTERNS, assert_close_to, pattern_case, reference  # noqa: E402

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE


@pytest.mark.slow
@pytest.mark.parametrize("pattern", PATTERNS)
def test_gradgradcheck_of_every_pattern_on_triton(generator, pattern):
    """Values equal the float64 reference and first and second derivatives match finite differences on the
    Triton kernels, for every pattern of gathered, one-row and channel-shared operands."""
    operands, C, rule, indices, size_out = pattern_case(generator, pattern)
    expected = reference(*operands[:3], C, rule, indices, size_out)
    operands = [None if t is None else t.to(DEVICE) for t in operands]
    indices = [None if i is None else i.to(DEVICE) for i in indices]
    inputs = tuple(t.requires_grad_() for t in operands + [C.to(DEVICE)] if t is not None)
    weighted = operands[2] is not None

    def f(*args):
        W = args[2] if weighted else None
        return sa.accumulate_rule(args[0], args[1], rule, args[-1], W, indices_1=indices[0], indices_2=indices[1],
                                  indices_w=indices[2], indices_out=indices[3], size_out=size_out,
                                  implementation="triton")

    assert_close_to(f(*inputs).cpu(), expected, 1e-12)
    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, inputs, fast_mode=True)
