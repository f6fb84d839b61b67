"""The first forward of a message-passing call starts compiling its gradients' kernels: every kernel the
backward and the force-training double backward then launch was handed to the compile workers before the
forward's own launch, with the same arguments; the first call of the rule op (``accumulate``) does so for its
backward. Run on the Triton interpreter (without a GPU), with the workers' prefetch recorded instead of
compiling."""
import interpreted

interpreted.enable()

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("e3nn")
pytest.importorskip("triton")

from e3nn import o3  # noqa: E402

from sparse_accumulation.e3nn import TensorProduct  # noqa: E402
from sparse_accumulation.kernels.triton import build, launch  # noqa: E402
import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.ops.accumulate import eager as accumulate_eager  # noqa: E402
from sparse_accumulation.ops.graph import derivatives  # noqa: E402

interpreted.restore()
_interpreter = interpreted.module_fixture()
DEVICE = interpreted.DEVICE


def _signature(args) -> tuple:
    """What a compiled kernel is specialised on: pointer dtypes and alignment, integers' width (not their
    values, see ``build.autotuned``)."""
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else -2**31 <= a < 2**31
                 for a in args)


@pytest.fixture
def events(monkeypatch):
    """``("prefetch" | "launch", kernel, argument signature)`` in the order they happen."""
    recorded = []
    monkeypatch.setattr(derivatives, "_prefetched", set())
    monkeypatch.setattr(accumulate_eager, "_prefetched", set())
    monkeypatch.setattr(build, "prefetching", lambda: True)
    monkeypatch.setattr(build, "compiled", lambda kernel, args, grid: True)  # launches as if compiled ahead
    monkeypatch.setattr(build, "prefetch", lambda kernel, args, grid: recorded.append(
        ("prefetch", kernel, _signature(args))))
    original = launch._public_or_first

    def public_or_first(kernel, grid, pointers, ints, *args, **kwargs):
        recorded.append(("launch", kernel, _signature(list(pointers) + list(ints))))
        return original(kernel, grid, pointers, ints, *args, **kwargs)

    monkeypatch.setattr(launch, "_public_or_first", public_or_first)
    return recorded


def _layer():
    irreps = o3.Irreps("2x0e + 2x1o")
    instructions, out = [], []
    for i1, (mul, ir1) in enumerate(irreps):
        for i2, (_, ir2) in enumerate(o3.Irreps("0e + 1o")):
            for ir in ir1 * ir2:
                if ir in irreps:
                    instructions.append((i1, i2, len(out), "uvu", True))
                    out.append((mul, ir))
    return TensorProduct(irreps, "0e + 1o", o3.Irreps(out), instructions, shared_weights=False,
                         internal_weights=False, implementation="triton").to(DEVICE)


def _inputs(generator, layer, nodes, edges, wanted=(True, True, True)):
    src = torch.randint(0, nodes, (edges,), generator=generator).to(DEVICE)
    dst = torch.randint(0, nodes, (edges,), generator=generator).to(DEVICE)
    tensors = [torch.randn(*shape, generator=generator).to(DEVICE).requires_grad_(w) for shape, w in zip(
        ((nodes, layer.irreps_in1.dim), (edges, layer.irreps_in2.dim), (edges, layer.weight_numel)), wanted)]
    return tensors, src, dst


def _unprefetched(launches, prefetches):
    """The launches whose kernel and arguments no prefetch named."""
    return [e for e in launches if not any(p[1] is e[1] and p[2] == e[2] for p in prefetches)]


def test_the_forward_prefetches_every_kernel_of_the_backward_and_the_double_backward(generator, events):
    layer = _layer()
    (x, Y, W), src, dst = _inputs(generator, layer, nodes=5, edges=19)
    out = layer(x, Y, W, indices_1=src, indices_out=dst, size_out=5)
    forward = list(events)
    assert [e[0] for e in forward][-1:] == ["launch"]  # the forward's own kernel, after the prefetches
    prefetched = [e for e in forward if e[0] == "prefetch"]
    grads = torch.autograd.grad(out.square().sum(), (x, Y, W), create_graph=True)
    first = len(events)
    sum(g.square().sum() for g in grads).backward()
    backward = [e for e in events[len(forward):first] if e[0] == "launch"]
    double = [e for e in events[first:] if e[0] == "launch"]
    assert backward and double
    assert _unprefetched(backward, prefetched) == [] and _unprefetched(double, prefetched) == []
    # the backward's calls were of kinds the forward had prefetched: nothing more was asked
    assert [e for e in events[len(forward):] if e[0] == "prefetch"] == []


def test_a_second_forward_of_the_same_kind_prefetches_nothing(generator, events):
    layer = _layer()
    (x, Y, W), src, dst = _inputs(generator, layer, nodes=4, edges=11)
    layer(x, Y, W, indices_1=src, indices_out=dst, size_out=4)
    first = len([e for e in events if e[0] == "prefetch"])
    (x, Y, W), src, dst = _inputs(generator, layer, nodes=6, edges=23)
    layer(x, Y, W, indices_1=src, indices_out=dst, size_out=6)
    assert first and len([e for e in events if e[0] == "prefetch"]) == first


def test_nothing_is_prefetched_without_gradients_or_without_workers(generator, events, monkeypatch):
    layer = _layer()
    (x, Y, W), src, dst = _inputs(generator, layer, nodes=4, edges=11, wanted=(False, False, False))
    layer(x, Y, W, indices_1=src, indices_out=dst, size_out=4)
    with torch.inference_mode():
        layer(x, Y, W, indices_1=src, indices_out=dst, size_out=4)
    assert [e[0] for e in events if e[0] == "prefetch"] == []
    monkeypatch.setattr(build, "prefetching", lambda: False)
    (x, Y, W), src, dst = _inputs(generator, layer, nodes=4, edges=11)
    layer(x, Y, W, indices_1=src, indices_out=dst, size_out=4)
    assert [e[0] for e in events if e[0] == "prefetch"] == []



@pytest.mark.parametrize("l", [2, 6])  # one gradient kernel for both inputs (narrow rules), one per input (wide)
def test_the_first_call_of_the_rule_op_prefetches_its_backward(generator, events, l):
    m1, m2, mu, C = sa.get_cg_transformation_rule(l, l, l, device=DEVICE)
    X1, X2 = (torch.randn(3, 5, 2 * l + 1, generator=generator).to(DEVICE).requires_grad_() for _ in range(2))
    out = sa.accumulate(X1, X2, mu, 2 * l + 1, m1, m2, C, implementation="triton")
    forward = list(events)
    assert [e[0] for e in forward][-1:] == ["launch"]
    prefetched = [e for e in forward if e[0] == "prefetch"]
    out.square().sum().backward()
    backward = [e for e in events[len(forward):] if e[0] == "launch"]
    assert backward and _unprefetched(backward, prefetched) == []
    assert torch.allclose(X1.grad, torch.autograd.grad(
        sa.accumulate(X1, X2, mu, 2 * l + 1, m1, m2, C, implementation="torch").square().sum(), X1)[0], atol=1e-4)
