"""Shared helpers of the interaction-sum tests: random pair lists and an independent float64 loop oracle."""
import numpy as np
import torch

#: tolerance of a result against the float64 oracle of the same (rounded) inputs, relative to its largest value
TOLERANCES = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(TOLERANCES)


def random_pairs(generator, n_atoms, n_pairs, index_dtype=torch.int64):
    """Unsorted pairs over atoms ``0 .. n_atoms - 2`` (the last atom is in no pair), with repeated pairs and
    self-pairs."""
    first = torch.randint(0, n_atoms - 1, (n_pairs,), generator=generator)
    second = torch.randint(0, n_atoms - 1, (n_pairs,), generator=generator)
    if n_pairs >= 6:
        first[-2:], second[-2:] = first[:2], second[:2]  # repeated pairs
        second[2] = first[2]  # a self-pair
    return first.to(index_dtype), second.to(index_dtype)


def random_inputs(generator, n_atoms=7, n_pairs=40, n_nu=5, n_feat=6, dtype=torch.float64,
                  index_dtype=torch.int64, sparse=False):
    """``(sensitivities, features, env, pair_first, pair_second)``; with ``sparse`` about two thirds of the
    sensitivities are exactly zero (as hippynn's cut-off sensitivities are)."""
    s = torch.randn(n_pairs, n_nu, generator=generator, dtype=torch.float64)
    if sparse:
        s = s * (torch.rand(n_pairs, n_nu, generator=generator, dtype=torch.float64) < 0.35)
    z = torch.randn(n_atoms, n_feat, generator=generator, dtype=torch.float64)
    env = torch.randn(n_atoms, n_nu, n_feat, generator=generator, dtype=torch.float64)
    first, second = random_pairs(generator, n_atoms, n_pairs, index_dtype)
    return s.to(dtype), z.to(dtype), env.to(dtype), first, second


def _numpy(*tensors):
    return [t.detach().cpu().double().numpy() if t.is_floating_point() else t.cpu().numpy() for t in tensors]


@np.errstate(invalid="ignore")
def loop_envsum(s, z, first, second):
    s, z, first, second = _numpy(s, z, first, second)
    out = np.zeros((z.shape[0], s.shape[1], z.shape[1]))
    for p in range(len(first)):
        out[first[p]] += np.outer(s[p], z[second[p]])
    return torch.from_numpy(out)


@np.errstate(invalid="ignore")
def loop_sensesum(env, z, first, second):
    env, z, first, second = _numpy(env, z, first, second)
    out = np.zeros((len(first), env.shape[1]))
    for p in range(len(first)):
        out[p] = env[first[p]] @ z[second[p]]
    return torch.from_numpy(out)


@np.errstate(invalid="ignore")
def loop_featsum(env, sense, first, second):
    env, sense, first, second = _numpy(env, sense, first, second)
    out = np.zeros((env.shape[0], env.shape[2]))
    for p in range(len(first)):
        out[second[p]] += sense[p] @ env[first[p]]
    return torch.from_numpy(out)


LOOPS = {"envsum": loop_envsum, "sensesum": loop_sensesum, "featsum": loop_featsum}


def arguments(name, s, z, env, first, second):
    """The data arguments of sum ``name`` from the inputs of :func:`random_inputs`."""
    return {"envsum": (s, z), "sensesum": (env, z), "featsum": (env, s)}[name] + (first, second)


def assert_close_to_oracle(got, expected, dtype):
    """``got`` (any dtype) against the float64 oracle, within the dtype's tolerance of the largest value."""
    assert got.shape == expected.shape
    scale = max(float(expected.abs().max()), 1.0) if expected.numel() else 1.0
    error = float((got.detach().double().cpu() - expected).abs().max()) if expected.numel() else 0.0
    assert error <= TOLERANCES[dtype] * scale, (error, scale)
