"""A CPU install without triton (an extra: ``[gpu]``): in a process where ``import triton`` fails, the package
imports, the CPU kernels compute (eager and compiled) what the references do, the self-check passes with triton
reported as not available, and asking for triton names what is missing."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import sys
    sys.modules["triton"] = None  # import triton raises ImportError, as where it is not installed
    import torch
    import sparse_accumulation as sa
    from sparse_accumulation import backends
    from sparse_accumulation.cli import main

    assert not backends.is_available("triton", "cpu") and backends.resolve("auto", "cpu") == "numba"
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 3, dtype=torch.float64)
    X1 = torch.randn(300, 8, 5, dtype=torch.float64, requires_grad=True)
    X2 = torch.randn(300, 8, 3, dtype=torch.float64, requires_grad=True)
    out = sa.accumulate(X1, X2, mu, 7, m1, m2, C)
    expected = sa.reference.index_add(X1, X2, mu, 7, m1, m2, C)
    G = torch.randn_like(out)
    got, want = torch.autograd.grad(out, (X1, X2), G), torch.autograd.grad(expected, (X1, X2), G)
    for a, b in zip((out,) + got, (expected,) + want):
        assert (a - b).abs().max() <= 1e-12 * b.abs().max(), (a - b).abs().max()
    compiled = torch.compile(lambda a, b: sa.accumulate(a, b, mu, 7, m1, m2, C))
    assert (compiled(X1, X2) - expected).abs().max() <= 1e-12 * expected.abs().max()
    try:
        sa.accumulate(X1, X2, mu, 7, m1, m2, C, implementation="triton")
    except RuntimeError as error:
        assert "triton is not installed" in str(error), error
    else:
        raise AssertionError("implementation='triton' ran without triton")
    assert main(["check", "--device", "cpu", "-q", "--implementations", "numba,triton"]) == 0
    print("fine without triton")
''')


def test_the_cpu_package_runs_without_triton():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "fine without triton" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "triton  cpu   skipped" in done.stdout
