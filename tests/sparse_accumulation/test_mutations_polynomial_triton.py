"""Element outputs of the Triton polynomial kernels (interpreted on the CPU without a GPU, ``interpreted.py``)
summed over MANY tiles of each element (``triton_polynomial.element_tile_rows``: per-tile partial sums, then
summed over each element's tiles in order), against the brute-force float64 loop over ``Program.terms``."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from polynomial_helpers import random_operands, random_program, reference  # noqa: E402
from sparse_accumulation.indices import Elements  # noqa: E402
from sparse_accumulation.kernels.triton import polynomial as triton_polynomial  # noqa: E402

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE


@pytest.mark.parametrize("tile_rows", [None, 41, 128])
def test_element_outputs_sum_every_tile_of_an_element(generator, monkeypatch, tile_rows):
    """Nodes of 2 elements, several element tiles each: the derivative program's element output (the gradient of
    P, computed alone) sums every tile of an element; with tiles of 41 and 128 nodes, every node of a long tile
    too (None: the tiles the kernels choose for the node count)."""
    if tile_rows is not None:
        monkeypatch.setattr(triton_polynomial, "element_tile_rows", lambda nodes: tile_rows)
    program = random_program(generator, channels=2, terms=6)
    rows = tile_rows or triton_polynomial.element_tile_rows(7 * 16)
    nodes = 7 * (tile_rows or 16)
    values = (torch.arange(nodes) % 2)[torch.randperm(nodes, generator=generator)]
    elements = Elements(values, 2)
    _, offsets = elements.tiles(rows)
    assert (offsets[1:] - offsets[:-1]).min().item() >= 3
    tensors = random_operands(generator, program, nodes, 2)
    cotangent = torch.randn(nodes, program.outputs[0].width, generator=generator, dtype=torch.float64)
    derivative = program.derivative((0, 1, 2), (True,))
    operands = tensors + [cotangent]
    (got,) = triton_polynomial.run(derivative, [t.to(DEVICE) for t in operands], Elements(values.to(DEVICE), 2),
                                   (1,))
    (expected,) = reference(derivative, operands, elements, (1,))
    assert derivative.outputs[1].kind == "element"
    scale = expected.abs().max().item()
    torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-12, atol=1e-12 * scale)
