"""Element-weighted polynomial programs on paths no other test reaches:

* element outputs (the gradient of the per-element weight table) summed over MANY 32-node tiles of each
  element (``numba_polynomial.TILE_ROWS``), against the brute-force float64 loop over ``Program.terms``;
* the threaded numba path (``N * channels * steps >= numba_polynomial.SERIAL_WORK`` with more than one
  thread: ranges of tiles on the thread pool), against the plain torch kernels in float64, and float32 within
  a few float32 roundings.
"""
import pytest
import torch

from polynomial_helpers import random_elements, random_operands, random_program, reference
from sparse_accumulation.indices import Elements
from sparse_accumulation.kernels.numba import polynomial as numba_polynomial, threads as numba_threads
from sparse_accumulation.kernels.torch import polynomial as torch_polynomial
from sparse_accumulation.backends import kernel_module
from sparse_accumulation.ops.polynomial.api import evaluate

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

IMPLEMENTATIONS = ("numba", "torch")


def _assert_close(ours, theirs, rtol):
    """``ours`` against the float64 ``theirs``: relative ``rtol``, absolute ``rtol`` times the largest reference
    value (exact zeros where the reference is all zeros: an output no term of a random program writes)."""
    theirs = theirs.double()
    scale = theirs.abs().max().item() if theirs.numel() else 0.0
    torch.testing.assert_close(ours.double(), theirs, rtol=rtol, atol=rtol * scale)


def _tiles_per_element(elements: Elements, rows: int) -> list:
    _, offsets = elements.tiles(rows)
    return (offsets[1:] - offsets[:-1]).tolist()


def _two_elements(generator, nodes):
    """Elements of ``nodes`` nodes, about half of each of two elements, in random order."""
    values = torch.arange(nodes) % 2
    return Elements(values[torch.randperm(nodes, generator=generator)], 2)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_element_outputs_sum_every_tile_of_an_element(generator, implementation):
    """150 nodes of 2 elements: each element's nodes fill 3 tiles of 32. The derivative program's element
    output (the gradient of P) is the sum over ALL of an element's nodes (every tile, in order), its lane
    outputs every node's own value: equal to the brute-force float64 reference."""
    program = random_program(generator, channels=3)
    nodes = 150
    elements = _two_elements(generator, nodes)
    assert min(_tiles_per_element(elements, numba_polynomial.TILE_ROWS)) >= 3
    tensors = random_operands(generator, program, nodes, 2)
    cotangent = torch.randn(nodes, program.outputs[0].width, generator=generator, dtype=torch.float64)
    derivative = program.derivative((0, 1, 2), (True,))
    assert [slot.kind for slot in derivative.outputs] == ["lane", "element", "lane"]
    got = kernel_module("polynomial", implementation).run(derivative, tensors + [cotangent], elements, (0, 1, 2))
    expected = reference(derivative, tensors + [cotangent], elements)
    for a, b in zip(got, expected):
        _assert_close(a, b, 1e-12)
    # the element output alone (the kernel's element path without lane outputs beside it)
    (alone,) = kernel_module("polynomial", implementation).run(derivative, tensors + [cotangent], elements, (1,))
    _assert_close(alone, expected[1], 1e-12)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_gradient_of_the_weight_table_through_autograd(generator, implementation):
    """``evaluate`` differentiated with respect to the element operand P (150 nodes of 2 elements, several
    tiles each) equals the brute-force derivative program; and in float32 within 2e-6 of the largest value."""
    program = random_program(generator, channels=3)
    nodes = 150
    elements = _two_elements(generator, nodes)
    tensors = random_operands(generator, program, nodes, 2)
    cotangent = torch.randn(nodes, program.outputs[0].width, generator=generator, dtype=torch.float64)
    expected = reference(program.derivative((1,), (True,)), tensors + [cotangent], elements)[0]
    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        leaves = [t.to(dtype).requires_grad_() for t in tensors]
        out = evaluate(program, leaves, elements, implementation)[0]
        (grad_P,) = torch.autograd.grad(out, leaves[1], cotangent.to(dtype))
        assert grad_P.dtype == dtype and grad_P.shape == tensors[1].shape
        rounded = reference(program.derivative((1,), (True,)),
                            [t.to(dtype).double() for t in tensors + [cotangent]], elements)[0]
        _assert_close(grad_P, rounded if dtype != torch.float64 else expected, rtol)


@pytest.fixture
def thread_runs(monkeypatch):
    """``(tasks, threads)`` of every ``numba_threads.run`` call made during the test."""
    calls = []
    original = numba_threads.run

    def spy(function, tasks, threads):
        calls.append((tasks, threads))
        return original(function, tasks, threads)

    monkeypatch.setattr(numba_threads, "run", spy)
    return calls


def _threaded_case(generator, outputs_of):
    """A program on 16 channels and enough nodes (of 3 elements) for ``N * channels * steps`` to reach twice
    ``SERIAL_WORK`` for the outputs ``outputs_of(program)`` ask for."""
    program = random_program(generator, channels=16, terms=30)
    chosen, outputs = outputs_of(program)
    steps = numba_polynomial._plan(chosen, outputs).steps
    nodes = -(-2 * numba_polynomial.SERIAL_WORK // (16 * steps))
    assert nodes * 16 * steps >= 2 * numba_polynomial.SERIAL_WORK
    elements = random_elements(generator, nodes, 3)
    tensors = random_operands(generator, program, nodes, 3)
    cotangent = torch.randn(nodes, program.outputs[0].width, generator=generator, dtype=torch.float64)
    return program, chosen, outputs, elements, tensors, cotangent


@pytest.mark.parametrize("which", ["forward", "derivative"])
def test_threaded_path_computes_every_tile(generator, threads, thread_runs, which):
    """Above ``SERIAL_WORK`` the tiles are cut into one range per thread: every tile of every range must be
    computed (lane outputs of every node, element outputs of every tile): equal to the torch kernels in
    float64."""
    def outputs_of(program):
        if which == "forward":
            return program, (0,)
        return program.derivative((0, 1, 2), (True,)), (0, 1, 2)

    program, chosen, outputs, elements, tensors, cotangent = _threaded_case(generator, outputs_of)
    operands = tensors if which == "forward" else tensors + [cotangent]
    got = numba_polynomial.run(chosen, operands, elements, outputs)
    tiles = elements.tiles(numba_polynomial.TILE_ROWS)[0].shape[1]
    assert any(t > 1 for _, t in thread_runs), thread_runs  # the threaded path ran
    assert tiles > 2 * threads
    expected = torch_polynomial.run(chosen, operands, elements, outputs)
    for a, b in zip(got, expected):
        _assert_close(a, b, 1e-12)


def test_threaded_path_in_float32_keeps_float32_accuracy(generator, threads, thread_runs):
    """The threaded path in float32 (computed in float32): the forward within 2e-6 of the float64 torch
    kernels on the same (rounded) inputs, relative to the largest value."""
    program, chosen, outputs, elements, tensors, _ = _threaded_case(generator, lambda p: (p, (0,)))
    rounded = [t.float() for t in tensors]
    (got,) = numba_polynomial.run(chosen, rounded, elements, outputs)
    assert any(t > 1 for _, t in thread_runs), thread_runs
    assert got.dtype == torch.float32
    (expected,) = torch_polynomial.run(chosen, [t.double() for t in rounded], elements, outputs)
    _assert_close(got, expected, 2e-6)
