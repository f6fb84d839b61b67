"""Element-weighted polynomial programs (:mod:`sparse_accumulation.descriptors.programs`) on the CPU kernels (numba,
torch) against a brute-force float64 reference: outputs, derivative programs (lane and element outputs), the
registered op (opcheck) and its gradients to second order against finite differences."""
import pytest
import torch

from polynomial_helpers import random_elements, random_operands, random_program, reference
from sparse_accumulation.indices import Elements
from sparse_accumulation.backends import kernel_module
from sparse_accumulation.ops.polynomial.api import evaluate
from sparse_accumulation.descriptors.programs import Program, Slot, element_slot, lane_slot

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

IMPLEMENTATIONS = ("numba", "torch")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("nodes", [1, 9, 70])
def test_kernels_equal_the_reference(generator, implementation, nodes):
    program = random_program(generator)
    elements = random_elements(generator, nodes, 3)
    tensors = random_operands(generator, program, nodes, 3)
    got = kernel_module("polynomial", implementation).run(program, tensors, elements, (0,))
    assert torch.allclose(got[0], reference(program, tensors, elements)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_derivative_programs_equal_the_reference(generator, implementation):
    """Gradients of x (lane output) and P (element output: a sum over each element's nodes), as programs."""
    program = random_program(generator)
    elements = random_elements(generator, 75, 4)  # several tiles of one element
    tensors = random_operands(generator, program, 75, 4)
    cotangent = torch.randn(75, program.outputs[0].width, generator=generator, dtype=torch.float64)
    derivative = program.derivative((0, 1, 2), (True,))
    got = kernel_module("polynomial", implementation).run(derivative, tensors + [cotangent], elements, (0, 1, 2))
    expected = reference(derivative, tensors + [cotangent], elements)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    # and the derivative program is the derivative: autograd of the reference's torch twin
    leaves = [t.clone().requires_grad_() for t in tensors]
    out = _torch_reference(program, leaves, elements)
    # an operand no random term reads has no path to the output: its gradient is zero
    for a, b, leaf in zip(got, torch.autograd.grad(out, leaves, cotangent, allow_unused=True), leaves):
        assert torch.allclose(a, torch.zeros_like(leaf) if b is None else b, rtol=1e-12, atol=1e-12)


def _torch_reference(program, tensors, elements):
    """The program's output as differentiable torch operations, term by term."""
    gathered = [t[elements.tensor] if slot.kind == "element" else t for slot, t in zip(program.operands, tensors)]
    slot = program.outputs[0]
    out = tensors[0].new_zeros(len(elements), slot.width)
    for component, coefficient, factors in program.terms[0]:
        product = coefficient
        for s, m in factors:
            column_map = program.operands[s].map
            columns = column_map.base[m] + torch.arange(program.channels) * column_map.step[m]
            product = product * gathered[s][:, columns]
        target = slot.map.base[component] + torch.arange(program.channels) * slot.map.step[component]
        out = out.index_add(1, target, product)
    return out


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_gradients_to_second_order_match_finite_differences(generator, implementation):
    program = random_program(generator, channels=2, size_x=3, size_p=4, terms=8)
    elements = random_elements(generator, 7, 2)
    tensors = [t.requires_grad_() for t in random_operands(generator, program, 7, 2)]
    function = lambda *ts: evaluate(program, list(ts), elements, implementation)[0]  # noqa: E731
    assert torch.autograd.gradcheck(function, tensors)
    assert torch.autograd.gradgradcheck(function, tensors)


def test_registered_op_passes_opcheck(generator):
    program = random_program(generator)
    elements = random_elements(generator, 11, 3)
    tensors = [t.requires_grad_() for t in random_operands(generator, program, 11, 3)]
    args = (tensors, elements.tensor, elements.order, elements.starts, program.key, [0], "numba")
    torch.library.opcheck(torch.ops.sparse_accumulation.polynomial.default, args)


def test_float32_accumulates_in_float32_close_to_float64(generator):
    program = random_program(generator)
    elements = random_elements(generator, 40, 3)
    tensors = random_operands(generator, program, 40, 3)
    expected = reference(program, tensors, elements)[0]
    for implementation in IMPLEMENTATIONS:
        got = evaluate(program, [t.float() for t in tensors], elements, implementation)[0]
        assert got.dtype == torch.float32
        assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


@pytest.mark.parametrize("made_by", ["cpu pass", "device operations"])
def test_elements_tiles_cover_every_node_once_with_one_element_each(generator, made_by):
    """Both ways of making the tiles (numba's pass for CPU tensors, the device operations of other devices)."""
    from sparse_accumulation.indices import _tiles

    elements = random_elements(generator, 103, 5)
    table, offsets = elements.tiles(8) if made_by == "cpu pass" else _tiles(elements.starts, 103, 8)
    seen = []
    for t in range(table.shape[1]):
        element, start, end = table[:, t].tolist()
        nodes = elements.order[start:end]
        assert end - start <= 8
        assert (elements.tensor[nodes] == element).all()
        seen += nodes.tolist()
        if offsets[element] <= t < offsets[element + 1]:
            continue
        assert start == end  # the padding tiles past the last element's are empty
    assert sorted(seen) == list(range(103))


@pytest.mark.parametrize("nodes, num_elements, rows", [(0, 3, 4), (1, 1, 4), (37, 9, 4), (64, 2, 32), (200, 7, 16)])
def test_elements_tiles_of_the_cpu_pass_equal_the_device_operations(generator, nodes, num_elements, rows):
    """Tables and offsets equal entry for entry, elements without nodes and a node count that is a multiple of
    the tile size included."""
    from sparse_accumulation.indices import Elements, _tiles

    values = torch.randint(0, max(1, num_elements // 2), (nodes,), generator=generator) * 2  # odd elements empty
    elements = Elements(values.clamp(max=num_elements - 1), num_elements)
    for got, expected in zip(elements.tiles(rows), _tiles(elements.starts, nodes, rows)):
        assert torch.equal(got, expected)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_elements_tiles_compiled_on_cuda_equal_the_cpu_pass(generator):
    """The device operations as inductor compiles them for CUDA (whose searchsorted once read a sliced
    tensor from its storage's start, shifting every tile's element) against numba's pass."""
    from sparse_accumulation.indices import Elements, _tiles

    values = torch.randint(0, 89, (1000,), generator=generator)
    expected = Elements(values, 89).tiles(8)
    cuda = Elements(values.cuda(), 89)
    compiled = torch.compile(lambda starts: _tiles(starts, 1000, 8), fullgraph=True)
    for got, want in zip(compiled(cuda.starts), expected):
        assert torch.equal(got.cpu(), want)


def test_programs_are_interned_and_checked():
    x, p = lane_slot(2, 3), element_slot(2, 3)
    a = Program(3, (x, p), (x,), [[(0, 1.0, [(0, 0), (1, 1)])]])
    assert Program(3, (x, p), (x,), [[(0, 0.5, [(1, 1), (0, 0)]), (0, 0.5, [(0, 0), (1, 1)])]]) is a
    assert Program.from_key(a.key) is a
    with pytest.raises(ValueError, match="reads component 5 of operand 0"):
        Program(3, (x, p), (x,), [[(0, 1.0, [(0, 5)])]])
    with pytest.raises(ValueError, match="writes component 2"):
        Program(3, (x, p), (x,), [[(2, 1.0, [(0, 0)])]])
    with pytest.raises(ValueError, match="channels must be a positive int"):
        Program(0, (x,), (x,), [[]])
    with pytest.raises(ValueError, match="Slot of kind"):
        Program(3, (Slot("edge", x.map),), (x,), [[]])
    for key in ("poly1:unknown", "poly2:unknown", a.key[:-8]):
        with pytest.raises(ValueError, match="not a polynomial program key"):
            Program.from_key(key)


def test_elements_refuse_bad_input():
    with pytest.raises(TypeError, match="elements must have an integer dtype"):
        Elements(torch.zeros(3), 2)
    with pytest.raises(ValueError, match="elements must be 1-D"):
        Elements(torch.zeros(3, 1, dtype=torch.int64), 2)
    with pytest.raises(IndexError, match="out of range for num_elements=2"):
        Elements(torch.tensor([0, 2]), 2)
    with pytest.raises(ValueError, match="num_elements must be a positive int"):
        Elements(torch.tensor([0]), 0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_outputs_without_terms_are_zeros(generator, implementation):
    """Outputs asked for alone whose terms are none (the gradient of an operand no term reads) are zeros, not
    uninitialised memory (the allocator is first handed blocks full of NaN of the outputs' sizes)."""
    channels = 2
    terms = [[(0, 1.0, [(0, 0), (1, 1)])], [(1, 1.0, [(0, 2), (1, 0)])], []]
    program = Program(channels, (lane_slot(3, channels), element_slot(2, channels), lane_slot(2, channels)),
                      (lane_slot(2, channels), element_slot(2, channels), lane_slot(2, channels)), terms)
    elements = random_elements(generator, 9, 2)
    tensors = random_operands(generator, program, 9, 2)
    for output in (1, 2):
        for _ in range(3):
            torch.full((9, 2 * channels), float("nan"), dtype=torch.float64)  # made and freed at once
            got = evaluate(program, tensors, elements, implementation, outputs=[output])[0]
            expected = reference(program, tensors, elements)[output]
            assert torch.equal(got, expected) if output == 2 else torch.allclose(got, expected, rtol=1e-12)
