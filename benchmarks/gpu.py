"""GPU benchmark of the Triton kernels against references, one self-contained script.

    python benchmarks/gpu.py --json results.json --plot results   # on a CUDA machine (minutes: split with --cases)
    TRITON_INTERPRET=1 python benchmarks/gpu.py --small --json x   # smoke test on CPU (tiny rows)
    python benchmarks/gpu.py --replot benchmarks/gpu_h200.json --plot benchmarks/gpu_h200   # charts only

For each case (real CG rule l1 x l2 -> L, rows = A x B in the ``[A, B, M]`` layout, i.e. X ``[A*B, M]``
contiguous) it prints the correctness of every timed implementation against ``index_add`` and times (median,
``triton.testing.do_bench``; inputs rotated over copies larger than L2 where a set of inputs would fit there):

* ours forward kernel alone, each load/store strategy (``triton_accumulate.STRATEGIES``);
* ours through the public API ``sparse_accumulation.accumulate(..., implementation="triton")`` when importable
  (else forward+backward composed from the kernels): forward, forward+backward, with the gradient of C, and
  double backward, as called from Python ("eager"); forward and forward+backward also replayed from a CUDA
  graph (``triton.testing.do_bench_cudagraph``: the GPU time, without the host's launch overhead);
* references: torch ``index_add``, dense matmul over the outer product (may not fit: n/a), e3nn ``uuu``
  TensorProduct when e3nn is importable (its own coefficients and basis: timed, not checked).

Then what a user sees (``--timings``, ``--user-implementations``), measured by ``sparse_accumulation.bench``
as ``sparse-accumulation bench`` does, each result checked first: per implementation, forward and
forward+backward, "kernel" (calls back to back, synchronised once), "call" (CUDA events around one call,
inputs requiring grad, gradients reset each step), "compiled" (``torch.compile(fullgraph=True)``),
"reduce-overhead" (CUDA graphs) and "host" (host microseconds per call), beside plain torch ``sin(a * b)``
(``elementwise``) as the host-overhead floor. A timing that fails (a compile error) is reported with its reason.

The floor of a case is its bytes (every input read once, every output written once) over the measured
device-to-device copy bandwidth (read + write bytes). Final tables, a JSON file (``--json``) and charts
(``--plot``) hold it all.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import sparse_accumulation  # noqa: E402
from sparse_accumulation import bench as user_bench  # noqa: E402
from sparse_accumulation.bench.timing import compiled_kernels_only  # noqa: E402

try:  # the kernels alone, by load/store strategy: internal names, absent when the kernels are reorganised
    from sparse_accumulation.kernels import layout
    from sparse_accumulation.kernels.triton import accumulate as triton_accumulate
    from sparse_accumulation.indices import prepare_rule

    STRATEGIES = tuple(triton_accumulate.STRATEGIES)
    KERNELS_NOTE = ""
except Exception as _error:  # noqa: BLE001 - reported in the log, the rest of the script runs
    layout = triton_gpu = prepare_rule = None
    STRATEGIES = ()
    KERNELS_NOTE = f"kernel strategies not measured ({type(_error).__name__}: {_error})"

_PUBLIC = sparse_accumulation.accumulate

CASES = [
    # name, l1, l2, L, A, B, dtype
    ("8x8->8", 8, 8, 8, 1000, 2000, torch.float32),
    ("4x4->4", 4, 4, 4, 1000, 2000, torch.float32),
    ("2x2->2", 2, 2, 2, 1000, 2000, torch.float32),
    ("3x2->4", 3, 2, 4, 1000, 2000, torch.float32),
    ("1x1->2", 1, 1, 2, 1000, 2000, torch.float32),
    ("8x8->8 300", 8, 8, 8, 1000, 300, torch.float32),
    ("8x8->8 fp64", 8, 8, 8, 1000, 2000, torch.float64),
]
L2_BYTES = 64 * 2**20


def log(*args):
    print(*args, flush=True)


# ----------------------------------------------------------------------------------------------------------
# rules


def _random_real_like_rule(l1, l2, L, seed=0):
    """Fallback with the sparsity of a real CG rule: (a, b) -> +-|a +- b| when it is <= L."""
    entries = set()
    for a in range(-l1, l1 + 1):
        for b in range(-l2, l2 + 1):
            for M in {abs(a + b), abs(a - b)}:
                if M <= L:
                    entries.add((a + l1, b + l2, M + L))
                    entries.add((a + l1, b + l2, -M + L))
    entries = sorted(entries)
    rng = np.random.default_rng(seed)
    m1, m2, mu = (np.array(x, dtype=np.int64) for x in zip(*entries))
    return m1, m2, mu, rng.standard_normal(len(m1))


def get_rule(l1, l2, L):
    try:
        import cg

        m1, m2, mu, C = cg.transformation_rule(l1, l2, L, "real")
        return (np.asarray(m1, np.int64), np.asarray(m2, np.int64), np.asarray(mu, np.int64),
                np.asarray(C, np.float64)), "cg.transformation_rule"
    except Exception as error:  # ImportError, or the package not finished yet
        return _random_real_like_rule(l1, l2, L), f"random real-like rule ({type(error).__name__}: {error})"


# ----------------------------------------------------------------------------------------------------------
# timing


def bench(fn, device, budget_ms=100.0):
    """Median milliseconds of ``fn()``."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=budget_ms, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench_graph(fn, device, budget_ms=100.0):
    """Median milliseconds of ``fn()`` replayed from a CUDA graph: the GPU time of the work, without the
    host's launch overhead (what ``torch.compile(mode="reduce-overhead")`` or a captured training step sees)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=budget_ms, return_mode="median"))


def copy_bandwidth(device, small):
    """Bytes per second of a device-to-device copy (read + write)."""
    n = (2**20 if small else 2**28)  # floats: 4 MiB or 1 GiB
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), device)
    return 2 * src.numel() * 4 / (ms * 1e-3)


class Rotating:
    """Several copies of the input tensors, cycled, so that timed calls do not hit in L2."""

    def __init__(self, make, bytes_per_set, device):
        copies = 1 if device.type != "cuda" else max(1, min(8, math.ceil(4 * L2_BYTES / max(bytes_per_set, 1))))
        self.sets = [make() for _ in range(copies)]
        self.i = 0

    def next(self):
        self.i = (self.i + 1) % len(self.sets)
        return self.sets[self.i]


def rel_error(actual, expected):
    expected = expected.double()
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-300))


def is_oom(error):
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def fresh_leaves(*tensors):
    """Detached copies that require grad: each timed call differentiates with respect to new leaves."""
    return [t.detach().requires_grad_(True) for t in tensors]


def note_failure(result, label, error):
    """Record a failed measurement in the case's notes ("OOM" or the error type); print other tracebacks."""
    if not is_oom(error):
        traceback.print_exc()
    result["notes"].append(f"{label}: {'OOM' if is_oom(error) else type(error).__name__}")


# ----------------------------------------------------------------------------------------------------------
# implementations


def kernel_forward(X1, X2, C, rule, strategy):
    """The Triton forward kernel alone on ``[R, M]`` operands, through the kernels' module contract
    (``accumulate(X1, X2, W, C, rule, rows, strategy)``, rows planned by ``layout.plan``); the row plan is
    made once per shape and strides."""
    key = (X1.shape, X1.stride(), X2.shape, X2.stride())
    if key not in _ROW_PLANS:
        _ROW_PLANS[key] = layout.plan((X1, X2), ("X1", "X2"))[1]
    return triton_accumulate.accumulate(X1, X2, None, C, rule, _ROW_PLANS[key], strategy=strategy)


_ROW_PLANS = {}


def make_implementations(rule, rule_t, dtype, device, A, B, M1, M2, O):
    """{name: (forward(X1, X2, C) -> [R, O], forward+backward(X1, X2, C, G) or None)}."""
    m1, m2, mu = (t.to(device) for t in rule_t)
    impls = {}

    for strategy in STRATEGIES:
        impls[f"ours_{strategy}"] = (lambda X1, X2, C, s=strategy: kernel_forward(X1, X2, C, rule, s), None)

    def index_add(X1, X2, C):
        out = torch.zeros(X1.shape[0], O, dtype=X1.dtype, device=device)
        return out.index_add_(1, mu, X1[:, m1] * X2[:, m2] * C)

    impls["index_add"] = (index_add, None)

    def dense_matmul(X1, X2, C):
        d = torch.zeros(M1 * M2, O, dtype=dtype, device=device).index_put_((m1 * M2 + m2, mu), C,
                                                                         accumulate=True)
        return (X1[:, :, None] * X2[:, None, :]).reshape(X1.shape[0], M1 * M2) @ d

    impls["dense"] = (dense_matmul, None)
    return impls


def make_e3nn(l1, l2, L, A, B, device, dtype):
    try:
        from e3nn import o3
    except Exception as error:
        return None, f"e3nn not importable ({type(error).__name__})"
    start = time.perf_counter()
    try:
        tp = o3.TensorProduct(f"{B}x{l1}e", f"{B}x{l2}e", f"{B}x{L}e", [(0, 0, 0, "uuu", False)],
                              irrep_normalization="none", path_normalization="none")
        tp = tp.to(device=device, dtype=dtype)
    except Exception as error:
        return None, f"construction failed ({type(error).__name__}: {error})"
    return tp, f"built in {time.perf_counter() - start:.1f} s, B={B}"


# ----------------------------------------------------------------------------------------------------------


def run_case(name, l1, l2, L, A, B, dtype, device, copy_bw, args):
    M1, M2, O = 2 * l1 + 1, 2 * l2 + 1, 2 * L + 1
    R = A * B
    (m1_np, m2_np, mu_np, C_np), rule_source = get_rule(l1, l2, L)
    rule_t = tuple(torch.as_tensor(a) for a in (m1_np, m2_np, mu_np))
    rule = prepare_rule(*rule_t, M1, M2, O) if prepare_rule is not None else None
    elt = torch.tensor([], dtype=dtype).element_size()
    fwd_bytes = R * (M1 + M2 + O) * elt
    bwd_bytes = fwd_bytes + R * (O + M1 + M2 + M1 + M2) * elt
    nnz = len(m1_np)
    result = {"case": name, "l": [l1, l2, L], "rows": [A, B], "dtype": str(dtype).replace("torch.", ""),
              "nnz": nnz, "rule": rule_source, "floor_fwd_ms": fwd_bytes / copy_bw * 1e3,
              "floor_fwdbwd_ms": bwd_bytes / copy_bw * 1e3, "errors": {}, "ms": {}, "notes": []}
    log(f"\n== {name}: rows {A}x{B}, {result['dtype']}, nnz {nnz}, rule from {rule_source}")

    C = torch.as_tensor(C_np, dtype=dtype, device=device)

    def make_inputs():
        X1 = torch.randn(R, M1, dtype=dtype, device=device)
        X2 = torch.randn(R, M2, dtype=dtype, device=device)
        G = torch.randn(R, O, dtype=dtype, device=device)
        return X1, X2, G

    inputs = Rotating(make_inputs, fwd_bytes + R * O * elt, device)
    X1, X2, G = inputs.sets[0]
    impls = make_implementations(rule, rule_t, dtype, device, A, B, M1, M2, O)
    expected = impls["index_add"][0](X1, X2, C)

    # forward
    for impl, (fwd, _) in impls.items():
        try:
            result["errors"][impl] = rel_error(fwd(X1, X2, C), expected)
            budget = 100.0 if impl.startswith("ours") else 60.0
            result["ms"][f"{impl}_fwd"] = bench(lambda: fwd(*inputs.next()[:2], C), device, budget)
        except Exception as error:
            note_failure(result, f"{impl} fwd", error)
            result["ms"][f"{impl}_fwd"] = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        log(f"  {impl:14s} fwd  rel.err {result['errors'].get(impl, float('nan')):.2e}  "
            f"{fmt(result['ms'][f'{impl}_fwd'])} ms")

    # forward + backward, ours
    m1_d, m2_d, mu_d = (t.to(device) for t in rule_t)
    Cg = C.clone().requires_grad_(True)
    result["notes"].append("fwd+bwd through sparse_accumulation.accumulate(implementation='triton')")

    def ours_fwdbwd(X1, X2, G):
        X1, X2 = fresh_leaves(X1, X2)
        out = _PUBLIC(X1.view(A, B, M1), X2.view(A, B, M2), mu_d, O, m1_d, m2_d, C,
                      implementation="triton")
        return torch.autograd.grad(out, (X1, X2), G.view(A, B, O))

    def ours_fwdbwd_C(X1, X2, G):
        X1, X2 = fresh_leaves(X1, X2)
        out = _PUBLIC(X1.view(A, B, M1), X2.view(A, B, M2), mu_d, O, m1_d, m2_d, Cg,
                      implementation="triton")
        return torch.autograd.grad(out, (X1, X2, Cg), G.view(A, B, O))

    def ours_double(X1, X2, G, rows=(A, B)):
        X1, X2 = fresh_leaves(X1, X2)
        out = _PUBLIC(X1.view(*rows, M1), X2.view(*rows, M2), mu_d, O, m1_d, m2_d, C, implementation="triton")
        d1, d2 = torch.autograd.grad(out, (X1, X2), G.view(*rows, O), create_graph=True)
        return torch.autograd.grad((d1 * X1).sum() + (d2 * X2).sum(), (X1, X2))

    def ref_fwdbwd(fwd):
        def run(X1, X2, G):
            X1, X2 = fresh_leaves(X1, X2)
            return torch.autograd.grad(fwd(X1, X2, C), (X1, X2), G)
        return run

    def index_add_fwdbwd_C(X1, X2, G):
        X1, X2 = fresh_leaves(X1, X2)
        return torch.autograd.grad(impls["index_add"][0](X1, X2, Cg), (X1, X2, Cg), G)

    grads_ref = None
    for impl, fn in (("index_add", ref_fwdbwd(impls["index_add"][0])), ("ours", ours_fwdbwd),
                     ("dense", ref_fwdbwd(impls["dense"][0])), ("index_addC", index_add_fwdbwd_C),
                     ("oursC", ours_fwdbwd_C)):
        try:
            grads = fn(X1, X2, G)
            if impl.startswith("index_add"):
                grads_ref = grads
                if impl == "index_addC":
                    continue
            else:
                result["errors"][f"{impl}_fwdbwd"] = max(rel_error(a, b) for a, b in zip(grads, grads_ref))
            result["ms"][f"{impl}_fwdbwd"] = bench(lambda: fn(*inputs.next()), device,
                                                   100.0 if impl == "ours" else 60.0)
        except Exception as error:
            note_failure(result, f"{impl} fwd+bwd", error)
            result["ms"][f"{impl}_fwdbwd"] = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
        log(f"  {impl:14s} fwd+bwd  rel.err {result['errors'].get(f'{impl}_fwdbwd', 0.0):.2e}  "
            f"{fmt(result['ms'][f'{impl}_fwdbwd'])} ms")

    def ours_public_fwd(X1, X2):
        return _PUBLIC(X1.view(A, B, M1), X2.view(A, B, M2), mu_d, O, m1_d, m2_d, C, implementation="triton")

    timings = [("ours_public_fwd", bench, lambda: ours_public_fwd(*inputs.next()[:2]))]
    if device.type == "cuda":
        timings += [("ours_public_fwd_graph", bench_graph, lambda: ours_public_fwd(*inputs.next()[:2])),
                    ("ours_fwdbwd_graph", bench_graph, lambda: ours_fwdbwd(*inputs.next()))]
    for key, timer, fn in timings:
        try:
            result["ms"][key] = timer(fn, device)
        except Exception as error:
            note_failure(result, key, error)
            result["ms"][key] = None
        log(f"  {key:22s} {fmt(result['ms'][key])} ms")

    try:
        def index_add_double(X1, X2, G):
            X1, X2 = fresh_leaves(X1, X2)
            out = impls["index_add"][0](X1, X2, C)
            d1, d2 = torch.autograd.grad(out, (X1, X2), G, create_graph=True)
            return torch.autograd.grad((d1 * X1).sum() + (d2 * X2).sum(), (X1, X2))
        # checked on a slice (the index_add double backward is memory hungry)
        Xs = [t[:20000].contiguous() for t in (X1, X2, G)]
        got, want = ours_double(*Xs, rows=(1, Xs[0].shape[0])), index_add_double(*Xs)
        result["errors"]["ours_double"] = max(rel_error(a, b) for a, b in zip(got, want))
        result["ms"]["ours_double"] = bench(lambda: ours_double(*inputs.next()), device, 100.0)
    except Exception as error:
        note_failure(result, "double backward", error)
        result["ms"]["ours_double"] = None
    log(f"  ours double bwd  rel.err {result['errors'].get('ours_double', float('nan')):.2e}  "
        f"{fmt(result['ms'].get('ours_double'))} ms")

    # e3nn
    if not args.no_e3nn:
        tp, note = make_e3nn(l1, l2, L, A, B, device, dtype)
        result["notes"].append(f"e3nn: {note}")
        if tp is not None:
            try:
                def e3nn_fwd(X1, X2):
                    return tp(X1.view(A, B * M1), X2.view(A, B * M2))

                result["ms"]["e3nn_fwd"] = bench(lambda: e3nn_fwd(*inputs.next()[:2]), device, 60.0)

                def e3nn_fwdbwd(X1, X2, G):
                    X1, X2 = fresh_leaves(X1, X2)
                    return torch.autograd.grad(e3nn_fwd(X1, X2), (X1, X2), G.view(A, B * O))

                result["ms"]["e3nn_fwdbwd"] = bench(lambda: e3nn_fwdbwd(*inputs.next()), device, 60.0)
            except Exception as error:
                note_failure(result, "e3nn", error)
            log(f"  e3nn ({note}) fwd {fmt(result['ms'].get('e3nn_fwd'))} ms, "
                f"fwd+bwd {fmt(result['ms'].get('e3nn_fwdbwd'))} ms")
            del tp

    # GPU time of what the public API runs (graph replay), else the default strategy's kernel alone
    default_strategy = getattr(triton_gpu, "STRATEGY", None)
    fwd = result["ms"].get("ours_public_fwd_graph") or result["ms"].get(f"ours_{default_strategy}_fwd")
    result["copy_bw_fraction_fwd"] = result["floor_fwd_ms"] / fwd if fwd else None
    fb = result["ms"].get("ours_fwdbwd_graph") or result["ms"].get("ours_fwdbwd")
    result["copy_bw_fraction_fwdbwd"] = result["floor_fwdbwd_ms"] / fb if fb else None
    del inputs, X1, X2, G, impls, expected
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def profile_host_overhead(device):
    """Per-call host time of forward+backward on a small input, and where it goes (cProfile)."""
    import cProfile
    import pstats

    m1, m2, mu, C = (t.to(device) for t in _public_module().get_cg_transformation_rule(2, 2, 2))
    X1, X2, G = (torch.randn(1000, 5, device=device) for _ in range(3))

    def step():
        a, b = X1.detach().requires_grad_(), X2.detach().requires_grad_()
        out = _PUBLIC(a, b, mu, 5, m1, m2, C, implementation="triton")
        return torch.autograd.grad(out, (a, b), G)

    for _ in range(20):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    log(f"\nhost time per forward+backward (2x2->2, 1000 rows): {(time.perf_counter() - start) / 200 * 1e6:.0f} us")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        step()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


def _public_module():
    import sparse_accumulation

    return sparse_accumulation


def fmt(v, digits=3):
    if v is None:
        return "n/a"
    return f"{v:.{digits}f}" if v < 100 else f"{v:.0f}"


def table(results):
    head = ["case", "floor fwd/bwd"] + [f"{s} fwd" for s in STRATEGIES] + [
            "public fwd eager/graph", "fwd+bwd eager/graph", "+dC", "double bwd",
            "index_add fwd/bwd", "dense fwd/bwd", "e3nn fwd/bwd", "%copy fwd/bwd"]
    rows = []
    for r in results:
        ms = r["ms"]
        pct = "/".join("n/a" if x is None else f"{100 * x:.0f}%"
                       for x in (r["copy_bw_fraction_fwd"], r["copy_bw_fraction_fwdbwd"]))
        rows.append([r["case"], f"{fmt(r['floor_fwd_ms'])}/{fmt(r['floor_fwdbwd_ms'])}"]
                    + [fmt(ms.get(f"ours_{s}_fwd")) for s in STRATEGIES]
                    + [f"{fmt(ms.get('ours_public_fwd'))}/{fmt(ms.get('ours_public_fwd_graph'))}",
                       f"{fmt(ms.get('ours_fwdbwd'))}/{fmt(ms.get('ours_fwdbwd_graph'))}",
                     fmt(ms.get("oursC_fwdbwd")), fmt(ms.get("ours_double")),
                     f"{fmt(ms.get('index_add_fwd'))}/{fmt(ms.get('index_add_fwdbwd'))}",
                     f"{fmt(ms.get('dense_fwd'))}/{fmt(ms.get('dense_fwdbwd'))}",
                     f"{fmt(ms.get('e3nn_fwd'))}/{fmt(ms.get('e3nn_fwdbwd'))}", pct])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = [" | ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [head] + rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def user_view(l1, l2, L, A, B, dtype, device, args) -> list:
    """What a user sees, measured by ``sparse_accumulation.bench``: per implementation and mode (forward,
    forward+backward), the timings kernel, call, compiled, reduce-overhead and host, each result checked
    against float64 index_add first (see ``sparse-accumulation bench``)."""
    case = user_bench.Case(l1, l2, L, (A, B), dtype, device.type)
    results = user_bench.run_benchmark([case], args.user_implementations, timings=args.timings,
                                       repeats=args.repeats, warmup=2, progress=True)
    log(user_bench.format_table(results))
    return results


def write_charts(data: dict, stem: str) -> list:
    """``stem.png`` / ``.svg`` from the kernel-level results, ``stem_user.png`` / ``.svg`` from the user view."""
    from plots import gpu_records

    paths = user_bench.plot_times(
        gpu_records(data), stem, title=f"benchmarks/gpu.py on {data['device']} (torch {data['torch']}, Triton "
                                       f"{data['triton']}); floor at {data['copy_bandwidth_Bps'] / 1e12:.2f} TB/s")
    user = [r for result in data["results"] for r in result.get("user", [])]
    if user:
        paths += user_bench.plot_results(user, f"{stem}_user",
                                         title=f"what a user sees: sparse_accumulation.bench on {data['device']} "
                                               f"(torch {data['torch']}, Triton {data['triton']})")
    return paths


def main(argv=None):
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", metavar="STEM", help="write the charts STEM.png/.svg (kernels, references) and "
                                                       "STEM_user.png/.svg (the user view); needs matplotlib")
    parser.add_argument("--replot", metavar="JSON", help="only draw the charts of a recorded --json file (with --plot)")
    parser.add_argument("--timings", type=lambda text: user_bench.normalize_timings(text.split(",") if text != "none"
                                                                                     else []),
                        default=user_bench.TIMINGS,
                        help=f"timings of the user view, comma-separated from {', '.join(user_bench.TIMINGS)}, "
                             "or none to skip it (default: all)")
    parser.add_argument("--user-implementations", type=lambda text: text.split(","), default=["triton", "elementwise"],
                        help="implementations of the user view (default: triton,elementwise; index_add is always "
                             "added as the baseline); e.g. triton,elementwise,e3nn,dense")
    parser.add_argument("--repeats", type=int, default=20, help="samples per timing of the user view (default: 20)")
    parser.add_argument("--small", action="store_true", help="tiny rows (a CPU smoke test under TRITON_INTERPRET=1)")
    parser.add_argument("--cases", help="comma-separated case names to run (default: all)")
    parser.add_argument("--no-e3nn", action="store_true", help="skip e3nn")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the host (Python) side of 2x2->2 forward+backward on 1000 rows")
    args = parser.parse_args(argv)
    if args.replot:
        if not args.plot:
            parser.error("--replot needs --plot STEM")
        with open(args.replot, encoding="utf-8") as f:
            log("\n".join(f"wrote {path}" for path in write_charts(json.load(f), args.plot)))
        return

    device = torch.device("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
                          else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("no CUDA device: run with TRITON_INTERPRET=1 --small for a CPU smoke test")
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (triton interpreter)"
    copy_bw = copy_bandwidth(device, args.small)
    log(f"device: {name}; torch {torch.__version__}; copy bandwidth {copy_bw / 1e12:.3f} TB/s (read+write)")
    log(f"strategies: {STRATEGIES or KERNELS_NOTE}; autotune {getattr(triton_gpu, 'AUTOTUNE', None)}; "
        f"{KERNELS_NOTE}")
    cases = CASES
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in CASES if c[0] in wanted]
    results = []
    for case_name, l1, l2, L, A, B, dtype in cases:
        if args.small:
            A, B = 3, 7
        results.append(run_case(case_name, l1, l2, L, A, B, dtype, device, copy_bw, args))
        if args.timings:
            log(f"\n== {case_name}: what a user sees")
            results[-1]["user"] = user_view(l1, l2, L, A, B, dtype, device, args)
    elapsed = time.perf_counter() - start
    log(f"\nms, median (floor = bytes / copy bandwidth; <strategy> fwd: the kernel alone; eager: the public API "
        f"as called from Python; graph: the same replayed from a CUDA graph, i.e. GPU time without launch "
        f"overhead; %copy = floor / graph time); total {elapsed:.0f} s")
    log(table(results))
    for r in results:
        errs = ", ".join(f"{k} {v:.1e}" for k, v in r["errors"].items())
        log(f"{r['case']}: rel.err vs index_add: {errs}; rule: {r['rule'][:60]}; notes: {'; '.join(r['notes'])}")
    user = [r for result in results for r in result.get("user", [])]
    if user:
        log("\nWhat a user sees (sparse_accumulation.bench; kernel: calls back to back, synchronised once; call: "
            "CUDA events around one training-step call, inputs requiring grad; compiled: torch.compile("
            "fullgraph=True); reduce-overhead: CUDA graphs; host: host us per call without synchronising; "
            "elementwise: plain torch sin(a * b) of the output's size, the host-overhead floor)")
        log(user_bench.format_table(user))
    if args.profile:
        profile_host_overhead(device)
    import triton

    data = {"device": name, "torch": torch.__version__, "triton": triton.__version__, "copy_bandwidth_Bps": copy_bw,
            "seconds": elapsed, "results": results}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    if args.plot:
        log("\n".join(f"wrote {path}" for path in write_charts(data, args.plot)))


if __name__ == "__main__":
    main()
