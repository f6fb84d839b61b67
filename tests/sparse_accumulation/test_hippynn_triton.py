"""Triton kernels of the interaction sums (``sparse_accumulation.kernels.triton_pair_sums``) against the float64
loop oracle.

On a CUDA machine (``TRITON_INTERPRET`` unset) the tests run compiled on CUDA tensors, those marked ``cuda``
included. Elsewhere :func:`test_in_the_interpreter` runs this file again in a subprocess with
``TRITON_INTERPRET=1`` in its environment from the start: triton decorates its own library functions
(``tl.sum``, ...) once, when it is imported, so the interpreter must be on before triton is first imported,
which the rest of the suite does early.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available() and not INTERPRETED
DEVICE = "cuda" if CUDA else "cpu"
here = pytest.mark.skipif(not (INTERPRETED or CUDA), reason="runs in the interpreter subprocess or on CUDA")
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation import indices  # noqa: E402
from sparse_accumulation.ops.pair_sums.registered import pairs_of  # noqa: E402
from sparse_accumulation.kernels.reference import pair_sums as pair_sums_reference  # noqa: E402
from pair_sums_helpers import DTYPES, LOOPS, arguments, assert_close_to_oracle, random_inputs  # noqa: E402

SUMS = ["envsum", "sensesum", "featsum"]


@pytest.mark.slow
def test_in_the_interpreter():
    if INTERPRETED or CUDA:
        pytest.skip("the kernels run in this process")
    pytest.importorskip("triton")
    environment = dict(os.environ, TRITON_INTERPRET="1")
    # the project's addopts (pytest-xdist's -n) are not the child's: it runs this file alone, in one process
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
                             "-m", "not cuda",
                             str(Path(__file__).resolve())], cwd=Path(__file__).resolve().parents[2],
                            env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def _kernels():
    from sparse_accumulation.kernels.triton import pair_sums as triton_pair_sums

    return triton_pair_sums


def _call(kernels, name, a, b, pair_first, pair_second):
    """Sum ``name`` on ``kernels`` with the public functions' arguments (the pairs prepared for it)."""
    return getattr(kernels, name)(a, b, pairs_of(name, a, b, pair_first, pair_second))


def _on_device(*tensors):
    return [t.to(DEVICE) for t in tensors]


@here
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_sum_and_dtype(generator, dtype):
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=6, n_pairs=45, n_nu=5, n_feat=7,
                                                         dtype=dtype))
    for name in SUMS:
        args = arguments(name, s, z, env, first, second)
        got = _call(_kernels(), name, *args)
        assert got.dtype == dtype and got.device.type == DEVICE
        assert_close_to_oracle(got, LOOPS[name](*args), dtype)


@here
@pytest.mark.parametrize("dtype", DTYPES)
def test_featsum_with_atomic_adds(generator, dtype, monkeypatch):
    """The other featsum (by pair_first, atomic adds), and its choice checked."""
    kernels = _kernels()
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=6, n_pairs=45, n_nu=5, n_feat=7,
                                                         dtype=dtype))
    monkeypatch.setattr(kernels, "FEATSUM", "atomic")
    got = _call(kernels, "featsum", env, s, first, second)
    assert got.dtype == dtype
    assert_close_to_oracle(got, LOOPS["featsum"](env, s, first, second), dtype)
    monkeypatch.setattr(kernels, "FEATSUM", "fast")
    with pytest.raises(ValueError, match="FEATSUM must be one of"):
        _call(kernels, "featsum", env, s, first, second)


@here
@pytest.mark.parametrize("shape", [(3, 70, 70, 20), (4, 12, 20, 130)])
def test_blocks_of_pairs_nu_and_feat(generator, shape):
    """Segments longer than a block of pairs, and nu / feat wider than one block (shape: atoms, pairs, nu,
    feat), int32 indices."""
    n_atoms, n_pairs, n_nu, n_feat = shape
    inputs = random_inputs(generator, n_atoms=n_atoms, n_pairs=n_pairs, n_nu=n_nu, n_feat=n_feat,
                           dtype=torch.float32, index_dtype=torch.int32)
    s, z, env, first, second = _on_device(*inputs)
    for name in SUMS:
        args = arguments(name, s, z, env, first, second)
        assert_close_to_oracle(_call(_kernels(), name, *args), LOOPS[name](*args), torch.float32)


@here
def test_no_pairs(generator):
    s, z, env, first, second = _on_device(*random_inputs(generator, n_pairs=0, dtype=torch.float32))
    kernels = _kernels()
    assert torch.equal(_call(kernels, "envsum", s, z, first, second), torch.zeros_like(env))
    assert _call(kernels, "sensesum", env, z, first, second).shape == (0, env.shape[1])
    assert torch.equal(_call(kernels, "featsum", env, s, first, second), torch.zeros_like(z))


@here
def test_out_of_range_pairs_are_left_out(generator, monkeypatch):
    """With the range check off, a pair with an index outside [0, n_atoms) adds nothing anywhere (CUDA's
    segments and masks; on CUDA the check is an asynchronous assertion)."""
    monkeypatch.setattr(indices.PairIndex, "check", lambda self, name: None)
    monkeypatch.setattr(indices.PairIndex, "segments",
                        lambda self, name: indices.segments(self.long(), self.n_atoms)[::-1])
    s, z, env, first, second = random_inputs(generator, n_atoms=6, n_pairs=30, n_nu=3, n_feat=5,
                                             dtype=torch.float32)
    first[4], second[9], first[11], second[20] = -1, 6, 1000, -7
    valid = (first >= 0) & (first < 6) & (second >= 0) & (second < 6)
    data_s, data_z, data_env, bad_first, bad_second = _on_device(s, z, env, first, second)
    kernels = _kernels()
    for name in SUMS + ["featsum, atomic"]:
        monkeypatch.setattr(kernels, "FEATSUM", "atomic" if name.endswith("atomic") else "segments")
        name = name.split(",")[0]
        args = arguments(name, data_s, data_z, data_env, bad_first, bad_second)
        got = _call(kernels, name, *args)
        if name == "sensesum":
            expected = LOOPS[name](env, z, first[valid], second[valid])
            assert_close_to_oracle(got[valid.to(DEVICE)], expected, torch.float32)
        else:
            kept = arguments(name, s[valid], z, env, first[valid], second[valid])
            assert_close_to_oracle(got, LOOPS[name](*kept), torch.float32)


@here
def test_public_functions_and_gradients_on_triton(generator):
    """The public functions with implementation="triton", forward, backward and double backward against
    torch's autograd of the reference formulas."""
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=5, n_pairs=16, n_nu=3, n_feat=4))
    s.requires_grad_()
    z.requires_grad_()

    def gradients(implementation):
        env_out = sa.envsum(s, z, first, second, implementation=implementation)
        energy = (env_out ** 2).sum() + sa.featsum(env_out, s, first, second, implementation=implementation).sum()
        (dz,) = torch.autograd.grad(energy, z, create_graph=True)
        return (energy,) + torch.autograd.grad((dz ** 2).sum(), (s, z))

    for got, expected in zip(gradients("triton"), gradients("index_add")):
        assert_close_to_oracle(got.cpu(), expected.detach().cpu(), torch.float64)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", SUMS)
def test_cuda_hippynn_medium_sizes(generator, dtype, name):
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=2100, n_pairs=43000, n_nu=20,
                                                         n_feat=20, dtype=dtype, sparse=True))
    args = arguments(name, s, z, env, first, second)
    expected = getattr(pair_sums_reference, name)(*(t.double() if t.is_floating_point() else t for t in args))
    assert_close_to_oracle(_call(_kernels(), name, *args), expected.cpu(), dtype)


@pytest.mark.cuda
@cuda_only
def test_cuda_calls_never_synchronise(generator):
    """Index checks, sorting and launches of a forward+backward step run without a host synchronisation."""
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=300, n_pairs=5000, n_nu=8,
                                                         n_feat=16, dtype=torch.float32))
    s.requires_grad_()
    z.requires_grad_()
    first, second = first.clone(), second.clone()  # not yet in the segments cache
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = sa.envsum(s, z, first, second)
        grads = torch.autograd.grad(out, (s, z), torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close_to_oracle(grads[1].cpu(), LOOPS["featsum"](torch.ones_like(out), s, first, second),
                           torch.float32)


@pytest.mark.cuda
@cuda_only
def test_cuda_out_of_range_index_fails_the_device_assertion(tmp_path):
    """The asynchronous check stops the process's CUDA work (run in a subprocess, whose context it ends)."""
    code = ("import torch, sparse_accumulation as sa\n"
            "z = torch.randn(4, 3, device='cuda'); s = torch.randn(5, 2, device='cuda')\n"
            "first = torch.tensor([0, 1, 2, 3, 0], device='cuda'); second = torch.tensor([1, 2, 9, 0, 1], device='cuda')\n"
            "env = sa.envsum(s, z, first, second)\n"
            "torch.cuda.synchronize()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "pair_second holds an atom index outside [0, 4)" in result.stderr or "device-side assert" in result.stderr


@here
@pytest.mark.parametrize("precision", ["auto", "tf32x3", "ieee"])
def test_float32_precisions(generator, precision, monkeypatch):
    """Every float32 product precision within float32's tolerance (unsorted, repeated and self pairs, an atom
    without pairs); an unknown one is refused."""
    kernels = _kernels()
    monkeypatch.setattr(kernels, "FLOAT32_PRECISION", precision)
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=9, n_pairs=60, n_nu=6, n_feat=10,
                                                         dtype=torch.float32))
    for name in SUMS + ["featsum, atomic"]:
        monkeypatch.setattr(kernels, "FEATSUM", "atomic" if name.endswith("atomic") else "segments")
        name = name.split(",")[0]
        args = arguments(name, s, z, env, first, second)
        assert_close_to_oracle(_call(kernels, name, *args), LOOPS[name](*args), torch.float32)
    monkeypatch.setattr(kernels, "FLOAT32_PRECISION", "tf32")
    with pytest.raises(ValueError, match="FLOAT32_PRECISION must be one of"):
        _call(kernels, "envsum", s, z, first, second)


@here
def test_block_configurations(generator, monkeypatch):
    """Other block shapes, warps and stages (triton_pair_sums.CONFIG, as the variants benchmark sets them): several
    blocks of pairs, nu and feat per segment."""
    kernels = _kernels()
    monkeypatch.setattr(kernels, "CONFIG", {
        "envsum": dict(BLOCK_P=16, BLOCK_NU=16, BLOCK_F=16, num_warps=2, num_stages=2),
        "sensesum": dict(BLOCK_P=16, BLOCK_NU=16, BLOCK_F=16, num_warps=2, num_stages=2),
        "featsum": dict(BLOCK_P=2, BLOCK_NU=4, BLOCK_F=16, num_warps=1)})
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=5, n_pairs=90, n_nu=37, n_feat=40,
                                                         dtype=torch.float32))
    for name in SUMS:
        args = arguments(name, s, z, env, first, second)
        assert_close_to_oracle(_call(kernels, name, *args), LOOPS[name](*args), torch.float32)


@here
def test_prepared_pairs_are_remembered_per_pair_of_tensors(generator):
    """The other index in segment order is made once per pair of index tensors and made again after an in-place
    change of either."""
    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=8, n_pairs=30, dtype=torch.float32))
    prepared = indices.Pairs(first, second, 8).by_first(other_in_order=True)
    assert indices.Pairs(first, second, 8).by_first(other_in_order=True) is prepared
    order, offsets, second_sorted = prepared
    assert torch.equal(second_sorted, second[order])
    assert torch.equal(first[order], torch.sort(first, stable=True).values)
    second[0] = (second[0] + 1) % 7
    again = indices.Pairs(first, second, 8).by_first(other_in_order=True)
    assert again is not prepared and torch.equal(again[2], second[again[0]])
    got = _call(_kernels(), "sensesum", env, z, first, second)
    assert_close_to_oracle(got, LOOPS["sensesum"](env, z, first, second), torch.float32)


@here
def test_eager_path_and_registered_ops_agree(generator):
    """The public functions' eager path (autograd Functions calling the kernels) and the registered ops give
    the same values and gradients, to second order."""
    from sparse_accumulation.ops.pair_sums import registered as ops

    s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=6, n_pairs=25, n_nu=3, n_feat=5))
    s.requires_grad_()
    z.requires_grad_()

    def through(envsum, featsum):
        out = envsum(s, z, first, second)
        energy = (out ** 2).sum() + featsum(out, s, first, second).sum()
        (dz,) = torch.autograd.grad(energy, z, create_graph=True)
        return (out,) + torch.autograd.grad((dz ** 2).sum(), (s, z))

    eager = through(lambda *a: sa.envsum(*a, implementation="triton"),
                    lambda *a: sa.featsum(*a, implementation="triton"))
    assert type(eager[0].grad_fn).__name__ == "_SumBackward"
    registered = through(lambda *a: ops.envsum(*a, "triton"), lambda *a: ops.featsum(*a, "triton"))
    for got, expected in zip(eager, registered):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@here
def test_inference_tensors_are_served_but_not_remembered(generator):
    """Index tensors made under inference mode have no version counter: prepared afresh for every call."""
    with torch.inference_mode():
        s, z, env, first, second = _on_device(*random_inputs(generator, n_atoms=7, n_pairs=30, n_nu=3, n_feat=5,
                                                             dtype=torch.float32))
        indices.clear()
        for name in SUMS:
            args = arguments(name, s, z, env, first, second)
            assert_close_to_oracle(_call(_kernels(), name, *args), LOOPS[name](*args), torch.float32)
        assert not len(indices._pairs_in_order)
