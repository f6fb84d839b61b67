"""Kernel variants of the Triton interaction sums (block shapes, warps, pipelining stages, register caps, float32
precision, featsum's method) on hippynn's simulated systems: each checked against the float64 formulas, then
timed (``triton.testing.do_bench``, median, L2 flushed), beside the copy floor of the same bytes.

    python benchmarks/hippynn_triton_variants.py --sizes large mega      # CUDA, hippynn installed

Prints one table: size, sum, variant, median ms, floor ms (the sum's bytes, each input read once and each output
written once, at the copy bandwidth measured in the same run), max rel err (against the largest reference
value). Also the host microseconds per call of the public functions at ``medium`` (a loop of calls without
synchronising, divided by the count).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation as sa  # noqa: E402
from sparse_accumulation.ops.pair_sums.registered import pairs_of  # noqa: E402
from sparse_accumulation.kernels.triton import pair_sums as K


def _pow2(n, low, high):
    return max(low, min(high, 1 << max(0, (n - 1).bit_length())))


def _config(spec: str, nu: int, feat: int) -> dict:
    """A kernel configuration from its name: ``p<BLOCK_P> nu<BLOCK_NU> f<BLOCK_F> w<warps> s<stages> r<maxnreg>
    a<BLOCK_A>`` (``nu`` capped at the next power of two of n_nu, ``f`` at that of n_feat), default when empty."""
    config = {}
    keys = {"p": "BLOCK_P", "nu": "BLOCK_NU", "f": "BLOCK_F", "w": "num_warps", "s": "num_stages", "r": "maxnreg",
            "a": "BLOCK_A"}
    for word in spec.split():
        for prefix in ("nu", "p", "f", "w", "s", "r", "a"):
            if word.startswith(prefix) and word[len(prefix):].isdigit():
                config[keys[prefix]] = int(word[len(prefix):])
                break
    if config:
        config.setdefault("BLOCK_P", 32)
        config.setdefault("num_stages", 1)
        config.setdefault("num_warps", 4)
        if "BLOCK_NU" in config:
            config["BLOCK_NU"] = min(config["BLOCK_NU"], _pow2(nu, 16, 128))
        if "BLOCK_F" in config:
            config["BLOCK_F"] = min(config["BLOCK_F"], _pow2(feat, 16, 128))
    return config


#: variants by sum: "[segments|atomic] <config> [ieee|tf32x3]" (featsum's method first; "default": the module's
#: choice). The lists hold the last round of the search that chose the defaults
VARIANTS = {
    "envsum": ["default", "p16 nu32 f32 w1 tf32x3", "p16 nu32 f16 w1", "p16 nu16 f32 w1", "p16 nu32 f32 w2",
               "p16 nu64 f32 w2", "p16 nu32 f64 w4", "p16 nu64 f64 w4", "p16 nu64 f64 w4 tf32x3"],
    "sensesum": ["default", "nu32 f16 w1 s1", "p16 nu32 f16 w1 s2", "nu64 f16 w2", "nu128 f16 w2", "nu128 f16 w4",
                 "nu32 f16 w1 ieee"],
    "featsum": ["segments default", "segments p8 nu8 f32 w1", "segments p8 nu8 f16 w1", "segments p16 nu8 f32 w2",
                "atomic default", "atomic nu32 f32 w2"],
}


def _settings(name, variant):
    """``(precision, featsum method, kernel, config spec)`` of a variant name."""
    words = variant.split()
    precision = "ieee" if "ieee" in words else "tf32x3" if "tf32x3" in words else "auto"
    method = words[0] if name == "featsum" else "segments"
    kernel = {"segments": "featsum", "atomic": "featsum_atomic"}[method] if name == "featsum" else name
    spec = " ".join(w for w in words if w not in ("ieee", "tf32x3", "default", "segments", "atomic"))
    return precision, method, kernel, spec


def _data(size, device):
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    from hippynn.custom_kernels import test_env

    np.random.seed(0)
    s, z, first, second = test_env.get_simulated_data(**test_env.TEST_PARAMS[size], dtype=torch.float32,
                                                      device=device)
    g = torch.Generator(device=device).manual_seed(0)
    env = torch.rand(z.shape[0], s.shape[1], z.shape[1], device=device, generator=g)
    return s, z, env, first, second


def _bench(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def _bytes(name, s, z, env, first, second):
    idx = first.numel() * first.element_size() * 2
    t = {"envsum": (s, z, env), "sensesum": (env, z, s), "featsum": (env, s, z)}[name]
    return sum(x.numel() * x.element_size() for x in t) + idx


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="+", default=["large", "mega"])
    parser.add_argument("--medium-config", default=None, help="CONFIG (JSON) for the host timing at medium")
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (all by default)")
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = []
    big = torch.empty(256 * 2**20, device=device)
    copy_ms = _bench(lambda: big.clone())
    bandwidth = 2 * big.numel() * 4 / (copy_ms * 1e-3)  # bytes read + written per second
    print(f"copy: {bandwidth / 1e12:.2f} TB/s", flush=True)
    for size in args.sizes:
        s, z, env, first, second = _data(size, device)
        nu, feat = s.shape[1], z.shape[1]
        ref = {"envsum": sa.envsum(s.double(), z.double(), first, second, implementation="torch"),
               "sensesum": sa.sensesum(env.double(), z.double(), first, second, implementation="torch"),
               "featsum": sa.featsum(env.double(), s.double(), first, second, implementation="torch")}
        inputs = {"envsum": (s, z), "sensesum": (env, z), "featsum": (env, s)}
        for name, table in VARIANTS.items():
            floor = _bytes(name, s, z, env, first, second) / bandwidth * 1e3
            for variant in table:
                if args.only is not None and variant not in args.only and name not in args.only:
                    continue
                precision, method, kernel, spec = _settings(name, variant)
                K.FLOAT32_PRECISION, K.FEATSUM = precision, method
                K.CONFIG = {kernel: _config(spec, nu, feat)}
                pairs = pairs_of(name, *inputs[name], first, second)
                fn = lambda: getattr(K, name)(*inputs[name], pairs)  # noqa: E731
                try:
                    out = fn()
                    err = float((out.double() - ref[name]).abs().max() / ref[name].abs().max())
                    again = fn()
                    same = bool(torch.equal(out, again))
                    ms = _bench(fn)
                except Exception as error:  # a variant that fails to compile or run
                    rows.append((size, name, variant, "fails", str(error)[-120:], "", ""))
                    print(*rows[-1], flush=True)
                    continue
                rows.append((size, name, variant, f"{ms:.4f}", f"{floor:.4f}", f"{err:.1e}",
                             "same" if same else "differs"))
                print(*rows[-1], flush=True)
        del s, z, env, ref
        torch.cuda.empty_cache()
    K.FLOAT32_PRECISION, K.FEATSUM, K.CONFIG = "auto", "segments", {}
    if args.medium_config:  # the kernels chosen for the host timing
        import json

        K.CONFIG = json.loads(args.medium_config)
    s, z, env, first, second = _data("medium", device)
    for name, a, b in (("envsum", s, z), ("sensesum", env, z), ("featsum", env, s)):
        fn = getattr(sa, name)
        for _ in range(20):
            fn(a, b, first, second)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn(a, b, first, second)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rows.append(("medium", name, "host us/call (loop, sync at end)", f"{(t1 - t0) / 200 * 1e6:.1f}",
                     f"{(t2 - t0) / 200 * 1e6:.1f}", "", ""))
    s.requires_grad_()
    z.requires_grad_()
    G = torch.randn(env.shape, device=device)

    def step():
        sa.envsum(s, z, first, second).backward(G)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    rows.append(("medium", "envsum fwd+bwd", "host us/call (loop, sync at end)", f"{(t1 - t0) / 100 * 1e6:.1f}",
                 f"{(t2 - t0) / 100 * 1e6:.1f}", "", ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(7)]
    print("\nsize  sum  variant  median_ms  floor_ms  max_rel_err  repeat")
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
