"""The numba kernels at sizes that split a call into blocks and tasks: every row once, broadcast operands read
in place and their gradients reduced without races, weighted rules, bitwise reproducible across thread counts.
Each case is checked against float64 ``index_add`` on expanded copies."""
from pathlib import Path

import threading

import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.kernels.numba import accumulate as numba_accumulate, accumulate_kernel, blocks as numba_blocks
from sparse_accumulation.kernels.numba import threads as numba_threads, transpose as numba_transpose
from accumulation_helpers import assert_close_to, random_rule

pytestmark = pytest.mark.usefixtures("sentinel_outputs")  # unwritten outputs read as NaN

# (X1 leading shape, X2 leading shape, W leading shape): several tasks, each broadcast the kernels reduce
PATTERNS = [
    ((300, 40), (300, 1), (300, 40)),  # X2 shared along B, tasks cut at multiples of B: added in place
    ((300, 40), (1, 40), (300, 1)),  # X2 shared along A: private copies per task
    ((3000,), (1,), (3000,)),  # one X2 row for every row
    ((3, 3000), (3, 1), (1, 3000)),  # B longer than a task: X2 private, W shared along A
]


def _expanded_reference(operands, lead, rule_arrays, O):
    m1, m2, mu, w, C = rule_arrays
    exact = [t.detach().double().requires_grad_() for t in operands]
    full = [t.expand(*lead, t.shape[-1]) for t in exact[:-1]]
    out = sa.reference.index_add(full[0], full[1], mu, O, m1, m2, exact[-1],
                                 **({} if w is None else {"W": full[2], "w": w}))
    return exact, out


def _check(generator, leads, weighted, dtype=torch.float64, sizes=(4, 3, 2, 5), nnz=20):
    M1, M2, Mw, O = sizes
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=nnz, dtype=dtype)
    w = torch.randint(0, Mw, (nnz,), generator=generator) if weighted else None
    sizes = (M1, M2, Mw)[: 3 if weighted else 2]
    operands = [torch.randn(*lead, size, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
                for lead, size in zip(leads, sizes)] + [C.requires_grad_()]
    lead = torch.broadcast_shapes(*leads[: len(sizes)])
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(M1, M2), w=w, weight_size=Mw if weighted else None)
    out = sa.accumulate_rule(operands[0], operands[1], rule, operands[-1],
                             W=operands[2] if weighted else None, implementation="numba")
    exact, expected = _expanded_reference(operands, lead, (m1, m2, mu, w, C), O)
    assert_close_to(out, expected, dtype)
    G = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    got = torch.autograd.grad(out, operands, G.to(dtype))
    for a, b in zip(got, torch.autograd.grad(expected, exact, G)):
        assert a.shape == b.shape
        assert_close_to(a, b, dtype)
    return out, got


def test_blocks_and_tasks_cover_every_row(generator):
    block, tasks = numba_blocks.BLOCK, numba_accumulate.MAX_TASKS
    for rows in (block - 1, block, block + 1, tasks * block - 1, tasks * block + 1, 3 * tasks * block + 7):
        _check(generator, [(rows,), (rows,)], weighted=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_wide_and_narrow_rows_across_blocks(generator, weighted, dtype):
    """Rows moved in vector tiles (17 and 9 components: tiles of 8 and the rest), narrow tiles (7) and element
    loops (2), over blocks that end within a tile, with the next block prefetched."""
    rows = 3 * numba_blocks.BLOCK + 13
    _check(generator, [(rows,), (rows,), (rows,)], weighted, dtype, sizes=(17, 9, 2, 7), nnz=60)
    _check(generator, [(rows,), (rows,), (rows,)], weighted, dtype, sizes=(7, 17, 9, 17), nnz=60)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_coefficient_gradient_with_and_without_the_gradient_of_x1(generator, weighted, dtype):
    """dC comes from the products of the pass that computes dX1 when dX1 is wanted (odd and even group sizes),
    and from a pass of its own when it is not."""
    M1, M2, Mw, O, nnz, rows = 9, 5, 3, 17, 41, numba_accumulate.SERIAL_ROWS + 300
    m1, m2, mu, C = random_rule(generator, M1, M2, O, nnz=nnz, dtype=dtype)
    w = torch.randint(0, Mw, (nnz,), generator=generator) if weighted else None
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(M1, M2), w=w, weight_size=Mw if weighted else None)
    X1, X2, W = (torch.randn(rows, size, generator=generator, dtype=torch.float64) for size in (M1, M2, Mw))
    G = torch.randn(rows, O, generator=generator, dtype=torch.float64)
    exact = C.double().requires_grad_()
    expected = sa.reference.index_add(X1, X2, mu, O, m1, m2, exact, **({"W": W, "w": w} if weighted else {}))
    (expected_dC,) = torch.autograd.grad(expected, exact, G)
    for wants_x1 in (True, False):
        operands = [X1.to(dtype).requires_grad_(wants_x1), X2.to(dtype), C.clone().requires_grad_()]
        out = sa.accumulate_rule(operands[0], operands[1], rule, operands[2],
                                 W=W.to(dtype) if weighted else None, implementation="numba")
        got = torch.autograd.grad(out, [t for t in operands if t.requires_grad], G.to(dtype))
        assert_close_to(got[-1], expected_dC, dtype)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("leads", PATTERNS)
def test_broadcast_gradients_are_reduced_across_tasks(generator, leads, weighted):
    _check(generator, leads, weighted)


def test_16_bit_broadcast_view_of_an_expanded_tensor(generator):
    """A stride-0 view converted to float32 is laid out anew; its rows must still be read right."""
    X2 = torch.randn(300, 1, 3, generator=generator, dtype=torch.float64).to(torch.bfloat16).expand(300, 40, 3)
    m1, m2, mu, C = random_rule(generator, 4, 3, 5, nnz=20, dtype=torch.bfloat16)
    X1 = torch.randn(300, 40, 4, generator=generator, dtype=torch.float64).to(torch.bfloat16)
    out = sa.accumulate(X1, X2, mu, 5, m1, m2, C, implementation="numba")
    expected = sa.reference.index_add(X1.double(), X2.double(), mu, 5, m1, m2, C.double())
    assert_close_to(out, expected, torch.bfloat16)


@pytest.mark.parametrize("weighted", [False, True])
def test_bitwise_reproducible_across_thread_counts(generator, weighted):
    state = generator.get_state()
    results = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            generator.set_state(state)
            results.append(_check(generator, PATTERNS[1], weighted, dtype=torch.float32))
    finally:
        torch.set_num_threads(previous)
    out_a, grads_a = results[0]
    for out_b, grads_b in results[1:]:
        assert torch.equal(out_a, out_b)
        for a, b in zip(grads_a, grads_b):
            assert torch.equal(a, b)


def test_threaded_calls_agree_bitwise_with_one_kernel_call(generator, monkeypatch):
    """Large calls run their tasks as ranges on threads, small ones in one kernel call: the same tasks, so the
    same bits."""
    m1, m2, mu, C = random_rule(generator, 4, 3, 5, nnz=20, dtype=torch.float32)
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(4, 3))  # random indices may miss the largest
    X1 = torch.randn(3000, 4, generator=generator, requires_grad=True)
    X2 = torch.randn(1, 3, generator=generator, requires_grad=True)  # its gradient: private copies per task
    C = C.requires_grad_()
    G = torch.randn(3000, 5, generator=generator)
    results = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    for serial_rows in (numba_accumulate.SERIAL_ROWS, 10 ** 9):  # on threads, then in one call
        monkeypatch.setattr(numba_accumulate, "SERIAL_ROWS", serial_rows)
        out = sa.accumulate_rule(X1, X2, rule, C, implementation="numba")
        results.append((out, *torch.autograd.grad(out, (X1, X2, C), G)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_thread_ranges_cover_every_task():
    for tasks in (1, 2, 5, 16):
        for threads in (1, 2, 3, tasks):
            seen, lock = [], threading.Lock()

            def record(first, last):
                with lock:
                    seen.extend(range(first, last))
            numba_threads.run(record, tasks, threads)
            assert sorted(seen) == list(range(tasks))


def test_errors_on_threads_reach_the_caller():
    def fail(first, last):
        if first > 0:
            raise ValueError("task range failed")
    with pytest.raises(ValueError, match="task range failed"):
        numba_threads.run(fail, 4, 2)


def test_variant_names_follow_every_kernel_source(tmp_path, monkeypatch):
    """numba's disk cache keys code by function name and checks only the file of a cached function: each
    variant's name carries its constants and a digest of every file compiled into it, so a change to a helper
    in another module compiles the kernel anew."""
    names = {accumulate_kernel.variant(*v).py_func.__qualname__ for v in accumulate_kernel.all_variants()}
    assert len(names) == 4
    assert all(name.endswith("_" + accumulate_kernel._SOURCE_TAG) for name in names)
    for module in (numba_transpose, numba_blocks):
        helper = tmp_path / Path(module.__file__).name
        helper.write_text(Path(module.__file__).read_text() + "\n# changed\n")
        with monkeypatch.context() as patch:
            patch.setattr(module, "__file__", str(helper))
            assert accumulate_kernel._source_tag() != accumulate_kernel._SOURCE_TAG


def test_compiled_kernels_can_be_cached(generator):
    """numba silently keeps code that uses dynamic globals (a function passed as an argument, for one) out of
    its disk cache, which would cost every process seconds of compiling: each compiled variant must pass its
    cache's check."""
    m1, m2, mu, C = random_rule(generator, 9, 5, 17, nnz=20, dtype=torch.float32)
    X1 = torch.randn(10, 9, generator=generator, requires_grad=True)
    X2 = torch.randn(10, 5, generator=generator)
    sa.accumulate(X1, X2, mu, 17, m1, m2, C, implementation="numba").sum().backward()
    kernel = accumulate_kernel.variant(False, False)
    assert kernel.overloads
    for compiled in kernel.overloads.values():
        assert kernel._cache._impl.check_cachable(compiled), kernel.py_func.__qualname__
