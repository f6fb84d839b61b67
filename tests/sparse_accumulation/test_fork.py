"""A child forked after the parent ran threaded calls (DataLoader workers, multiprocessing) runs every CPU kernel
family on the kernels' thread pool, which the child remakes instead of waiting on threads it does not have.

torch's own OpenMP regions hang in such a child (libgomp is not fork-safe; DataLoader workers therefore run
with one torch thread): the child here runs only this library's kernels, on inputs and prepared indices made by
the parent, with torch operations too small to open an OpenMP region."""
import multiprocessing
import sys

import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.indices import Elements
from sparse_accumulation.ops.polynomial.api import evaluate

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork start method")


def _inputs(generator) -> dict:
    """Operands of one call of each kernel family, each large enough to run on the thread pool."""
    from sparse_accumulation.mace import SymmetricContraction

    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 2, 2)
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 5))
    nodes, edges = 300, 4000
    src, dst = (torch.randint(0, nodes, (edges,), generator=generator) for _ in range(2))
    module = SymmetricContraction("16x0e + 16x1o", "16x0e", correlation=3, num_elements=2)
    with torch.no_grad():  # MACE's weights folded into the table of the polynomial kernel (a matmul: the parent's)
        table = module.weight_table()
    return {
        "accumulate": (torch.randn(4096, 5, generator=generator), torch.randn(4096, 5, generator=generator),
                       m1, m2, mu, C),
        "graph": (torch.randn(nodes, 16, 5, generator=generator), torch.randn(edges, 1, 5, generator=generator),
                  rule, C, sa.Index(src, nodes), sa.Index(dst, nodes), nodes),
        "envsum": (torch.randn(20000, 8, generator=generator), torch.randn(100, 32, generator=generator),
                   torch.randint(0, 100, (20000,), generator=generator),
                   torch.randint(0, 100, (20000,), generator=generator)),
        "polynomial": (module.program, torch.randn(1500, 16 * 4, generator=generator), table,
                       Elements(torch.randint(0, 2, (1500,), generator=generator), 2)),
    }


def _calls(inputs: dict) -> dict:
    X1, X2, m1, m2, mu, C = inputs["accumulate"]
    results = {"accumulate": sa.accumulate(X1, X2, mu, 5, m1, m2, C, implementation="numba")}
    x, y, rule, C, src, dst, nodes = inputs["graph"]
    results["graph"] = sa.accumulate_rule(x, y, rule, C, implementation="numba", indices_1=src, indices_out=dst,
                                          size_out=nodes)
    results["envsum"] = sa.envsum(*inputs["envsum"], implementation="numba")
    program, features, table, elements = inputs["polynomial"]
    results["polynomial"] = evaluate(program, [features, table], elements, "numba")[0]
    return results


def _child(queue, inputs):
    queue.put({name: t.numpy() for name, t in _calls(inputs).items()})


def test_forked_child_runs_every_kernel_family_after_threaded_calls(generator):
    if torch.get_num_threads() < 2:
        pytest.skip("the kernels run threaded only with two or more torch threads")
    inputs = _inputs(generator)
    expected = _calls(inputs)  # the parent's pool threads now exist
    _calls(inputs)  # the index tensors are prepared and remembered: the child sorts nothing
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue, inputs))
    child.start()
    try:
        got = queue.get(timeout=60)  # before join: the child exits once its results left through the pipe
    except Exception:
        got = None
    child.join(timeout=10)
    if child.is_alive():
        child.kill()
    if got is None:
        pytest.fail(f"the forked child hung in a threaded kernel call or failed (exit code {child.exitcode})")
    assert child.exitcode == 0
    for name, t in expected.items():
        assert torch.equal(torch.from_numpy(got[name]), t), name
