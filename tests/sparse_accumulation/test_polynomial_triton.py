"""Triton polynomial kernels (``sparse_accumulation.kernels.triton.polynomial``) against a brute-force float64
reference and the MACE module on the numba kernels; interpreted on the CPU without a GPU (``interpreted.py``),
the larger tests marked ``cuda`` only on a GPU (``pytest -m cuda``)."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")

from polynomial_helpers import random_elements, random_operands, random_program, reference  # noqa: E402
from sparse_accumulation.kernels.triton import polynomial as triton_polynomial  # noqa: E402
from sparse_accumulation.kernels.triton import polynomial_source  # noqa: E402
from sparse_accumulation.kernels.triton.polynomial_source import fits  # noqa: E402
from sparse_accumulation.mace import SymmetricContraction  # noqa: E402
from sparse_accumulation.descriptors.programs import Program, element_slot, lane_slot  # noqa: E402

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE


def _on_device(tensors):
    return [t.to(DEVICE) for t in tensors]


def _elements_on_device(elements):
    from sparse_accumulation.indices import Elements

    return Elements(elements.tensor.to(DEVICE), elements.num_elements)


@pytest.mark.parametrize("dtype, channels, lane_rows", [(torch.float64, 3, None), (torch.float64, 40, None),
                                                        (torch.float64, 40, 4),
                                                        pytest.param(torch.float32, 3, None, marks=pytest.mark.slow)])
def test_lane_and_element_outputs_equal_the_reference(generator, monkeypatch, dtype, channels, lane_rows):
    """A random program's output (lane) and its derivative program's gradients (lane and element outputs); 40
    channels take two blocks of channels, the second one partly masked; lane tiles of one node (what 21 nodes
    get) and of 4 (each program walks several nodes)."""
    if lane_rows is not None:
        monkeypatch.setattr(triton_polynomial, "lane_tile_rows", lambda nodes: lane_rows)
    program = random_program(generator, channels=channels)
    elements = random_elements(generator, 21, 3)
    tensors = random_operands(generator, program, 21, 3)
    cotangent = torch.randn(21, program.outputs[0].width, generator=generator, dtype=torch.float64)
    derivative = program.derivative((0, 1, 2), (True,))
    tolerance = 1e-12 if dtype == torch.float64 else 1e-4
    for prog, operands, outputs in ((program, tensors, (0,)), (derivative, tensors + [cotangent], (0, 1, 2))):
        got = triton_polynomial.run(prog, _on_device([t.to(dtype) for t in operands]),
                                    _elements_on_device(elements), outputs)
        expected = reference(prog, operands, elements, outputs)
        scale = max(b.abs().max().item() for b in expected)
        assert scale > 0
        for a, b in zip(got, expected):
            assert a.dtype == dtype
            assert torch.allclose(a.cpu().double(), b, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize("output", [0, 1])
def test_terms_split_into_chunks_equal_the_reference(generator, monkeypatch, output):
    """A call whose terms take several kernels (chunks of at most 5 terms and 4 held registers, an accumulator
    continued in the next chunk, which adds to what the first one stored): the gradient of x (lane) and of P
    (element) of a random program equal the reference."""
    monkeypatch.setattr(polynomial_source, "MAX_TERMS", 5)
    monkeypatch.setattr(polynomial_source, "MAX_HELD", 4)
    for _ in range(50):  # random programs until one has more than two chunks and a continued accumulator
        program = random_program(generator, channels=3, terms=30)
        derivative = program.derivative((0, 1), (True,))
        found = polynomial_source.chunks(derivative, (output,), polynomial_source.held_registers("tl.float64"))
        if len(found) > 2 and any(adds for chunk in found for _, _, adds, _ in chunk.accumulators):
            break
    else:
        pytest.fail("no random program of 30 terms continued an accumulator in a later chunk")
    elements = random_elements(generator, 23, 3)
    tensors = random_operands(generator, program, 23, 3)
    operands = tensors + [torch.randn(23, program.outputs[0].width, generator=generator, dtype=torch.float64)]
    (got,) = triton_polynomial.run(derivative, _on_device(operands), _elements_on_device(elements), (output,))
    (expected,) = reference(derivative, operands, elements, (output,))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-12, atol=1e-12 * expected.abs().max().item())


@pytest.mark.parametrize("limit", [3, 7])
def test_chunks_hold_at_most_their_limit_and_take_every_term_once(generator, limit):
    """However small the limit of held registers: no chunk of a lane output holds more element factors, none of
    an element output more element factors and accumulators, and the chunks take every term exactly once."""
    program = random_program(generator, channels=2, terms=40)
    derivative = program.derivative((0, 1), (True,))
    for output in (0, 1):
        found = polynomial_source.chunks(derivative, (output,), limit)
        taken = []
        for chunk in found:
            held = {f for *_, terms in chunk.accumulators for _, factors in terms for f in factors
                    if derivative.operands[f[0]].kind == "element"}
            assert len(held) + (len(chunk.accumulators) if chunk.element else 0) <= limit
            taken += [(c, coefficient, factors) for _, c, _, terms in chunk.accumulators
                      for coefficient, factors in terms]
        expected = [(c, coefficient, tuple(factors)) for c, coefficient, factors in derivative.terms[output]]
        assert sorted(taken) == sorted(expected) and (len(found) > 1 or limit > 3)


def test_the_chunks_of_a_call_compile_together_once(generator, monkeypatch):
    """The first call of a chunked program hands every chunk's kernel to ``build.compile_together`` at once
    (launches waiting for compiles then find them compiled in parallel); later calls do not."""
    from sparse_accumulation.kernels.triton import build

    together = []
    monkeypatch.setattr(build, "compile_together", lambda pairs, grid: together.append([k for k, _ in pairs]))
    monkeypatch.setattr(polynomial_source, "MAX_TERMS", 4)
    program = random_program(generator, channels=2, terms=20)
    elements = random_elements(generator, 9, 3)
    tensors = _on_device(random_operands(generator, program, 9, 3))
    for _ in range(2):
        triton_polynomial.run(program, tensors, _elements_on_device(elements), (0,))
    kernels, _ = triton_polynomial._kernels(program, (0,), "tl.float64")
    assert len(kernels) > 2 and together == [[k for k, _, _ in kernels]]


def test_compile_together_starts_every_compile_before_waiting(monkeypatch):
    """Three compiles that each wait for the other two finish: compile_together started them all first."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sparse_accumulation.kernels.triton import build

    barrier = threading.Barrier(3, timeout=20)
    with ThreadPoolExecutor(3) as pool:
        monkeypatch.setattr(build, "prefetching", lambda: True)
        monkeypatch.setattr(build, "prefetch", lambda kernel, args, grid, urgent=False: [pool.submit(barrier.wait)])
        build.compile_together([(kernel, []) for kernel in "abc"], None)
    assert not barrier.broken


def test_terms_with_two_element_factors_run_on_the_torch_kernels(generator):
    x, p = lane_slot(2, 2), element_slot(3, 2)
    program = Program(2, (x, p), (x,), [[(0, 1.5, [(0, 0), (1, 1), (1, 2)]), (1, -0.5, [(0, 1), (1, 0)])]])
    assert not fits(program, (0,))
    elements = random_elements(generator, 9, 2)
    tensors = random_operands(generator, program, 9, 2)
    got = triton_polynomial.run(program, _on_device(tensors), _elements_on_device(elements), (0,))[0]
    assert torch.allclose(got.cpu(), reference(program, tensors, elements)[0], rtol=1e-12, atol=1e-12)


def test_outputs_without_terms_are_zeros(generator):
    """A lane and an element output asked for alone whose terms are none: zeros."""
    x, p = lane_slot(3, 2), element_slot(2, 2)
    program = Program(2, (x, p), (x, p, x), [[(0, 1.0, [(0, 0), (1, 1)])], [], []])
    elements = random_elements(generator, 9, 2)
    tensors = random_operands(generator, program, 9, 2)
    for output in (1, 2):
        got = triton_polynomial.run(program, _on_device(tensors), _elements_on_device(elements), (output,))[0]
        assert torch.equal(got.cpu(), torch.zeros_like(reference(program, tensors, elements)[output]))


def test_mace_module_to_second_order_equals_numba(generator):
    """The module on the Triton kernels: output, gradients of x and weights, and the derivatives of the
    x-gradient (forces) equal the numba kernels'."""
    modules = {name: SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 2, num_elements=2, dtype=torch.float64,
                                          implementation=name) for name in ("numba", "triton")}
    state = {k: torch.randn(v.shape, generator=generator, dtype=torch.float64)
             for k, v in modules["numba"].state_dict().items()}
    x = torch.randn(7, 2, 4, generator=generator, dtype=torch.float64)
    elements = torch.randint(0, 2, (7,), generator=generator)
    direction = torch.randn(7, 2, 4, generator=generator, dtype=torch.float64)
    found = {}
    for name, module in modules.items():
        module.load_state_dict(state)
        module.to(DEVICE if name == "triton" else "cpu")
        device = next(module.parameters()).device
        xs = x.to(device).requires_grad_()
        out = module(xs, elements.to(device))
        gx, *gw = torch.autograd.grad((out ** 2).sum(), [xs, *module.parameters()], create_graph=True)
        second = torch.autograd.grad((gx * direction.to(device)).sum(), [xs, *module.parameters()])
        found[name] = [t.detach().cpu() for t in (out, gx, *gw, *second)]
    for a, b in zip(found["triton"], found["numba"]):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.cuda
@interpreted.cuda
def test_issue_configuration_on_cuda(generator):
    """128 channels, l <= 3 -> 0e + 1o, correlation 3, 10 elements, float32: equal to the numba kernels."""
    irreps_in, irreps_out = "128x0e+128x1o+128x2e+128x3o", "128x0e+128x1o"
    cpu = SymmetricContraction(irreps_in, irreps_out, 3, num_elements=10, implementation="numba")
    gpu = SymmetricContraction(irreps_in, irreps_out, 3, num_elements=10, implementation="triton").cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(3000, 128, 16, generator=generator)
    elements = torch.randint(0, 10, (3000,), generator=generator)
    xs = [x.clone().requires_grad_(), x.cuda().requires_grad_()]
    outs = [cpu(xs[0], elements), gpu(xs[1], elements.cuda())]
    assert torch.allclose(outs[1].cpu(), outs[0], rtol=1e-4, atol=1e-4 * outs[0].abs().max().item())
    grads = [torch.autograd.grad(o.square().sum(), [x_, *m.parameters()]) for o, x_, m in zip(outs, xs, (cpu, gpu))]
    for a, b in zip(grads[1], grads[0]):
        assert torch.allclose(a.cpu(), b, rtol=1e-3, atol=1e-3 * b.abs().max().item())


@pytest.mark.cuda
@interpreted.cuda
@pytest.mark.parametrize("channels", [1, 4, 8, 16, 24, 32, 48])
def test_every_channel_count_compiles_and_equals_numba_on_cuda(generator, channels):
    """Programs of few channels (tiles narrower than a warp's share of the block) compile for sm_90 and give the
    numba kernels' values and gradients to the second order."""
    irreps = f"{channels}x0e+{channels}x1o+{channels}x2e"
    cpu = SymmetricContraction(irreps, f"{channels}x0e+{channels}x1o", 3, num_elements=3, implementation="numba",
                               dtype=torch.float64)
    gpu = SymmetricContraction(irreps, f"{channels}x0e+{channels}x1o", 3, num_elements=3, implementation="triton",
                               dtype=torch.float64).cuda()
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(90, channels, 9, generator=generator, dtype=torch.float64)
    elements = torch.randint(0, 3, (90,), generator=generator)
    found = []
    for module, device in ((cpu, "cpu"), (gpu, "cuda")):
        leaf = x.to(device).requires_grad_()
        out = module(leaf, elements.to(device))
        (grad,) = torch.autograd.grad(out.square().sum(), leaf, create_graph=True)
        (second,) = torch.autograd.grad(grad.square().sum(), leaf)
        found.append([t.detach().cpu() for t in (out, grad, second)])
    for a, b in zip(found[1], found[0]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * b.abs().max().item())


@pytest.mark.parametrize("compiled_after", [None, 1])
def test_while_the_kernels_compile_calls_run_on_the_portable_kernels(generator, monkeypatch, compiled_after):
    """Kernels not compiled yet (``launch.ready`` False): the module's output, gradients and second derivatives
    come from the portable torch kernels, launching nothing; with the kernels ready after the first call the rest
    launches them; every result equals the numba kernels'."""
    from sparse_accumulation.kernels.triton import launch

    asked, launched = [], []
    monkeypatch.setattr(launch, "ready", lambda kernel, grid, pointers, ints: asked.append(kernel) or (
        compiled_after is not None and len(asked) > compiled_after))
    original = launch.launch
    monkeypatch.setattr(launch, "launch", lambda *args, **kwargs: launched.append(args[0]) or original(*args,
                                                                                                        **kwargs))
    modules = {name: SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 2, num_elements=2, dtype=torch.float64,
                                          implementation=name) for name in ("numba", "triton")}
    modules["triton"].load_state_dict(modules["numba"].state_dict())
    modules["triton"].to(DEVICE)
    x = torch.randn(7, 2, 4, generator=generator, dtype=torch.float64)
    elements = torch.randint(0, 2, (7,), generator=generator)
    found = {}
    for name, module in modules.items():
        device = next(module.parameters()).device
        xs = x.to(device).requires_grad_()
        out = module(xs, elements.to(device))
        gx, *gw = torch.autograd.grad(out.square().sum(), [xs, *module.parameters()], create_graph=True)
        second = torch.autograd.grad(gx.square().sum(), [xs, *module.parameters()])
        found[name] = [t.detach().cpu() for t in (out, gx, *gw, *second)]
    for a, b in zip(found["triton"], found["numba"]):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
    assert len(asked) >= 3
    assert len([k for k in launched if k in asked]) == (0 if compiled_after is None else len(asked) - compiled_after)
