"""What a user gets per call: one call at a time, inputs requiring gradients, eager and compiled.

For each case (real CG rule, rows) and each way of calling (eager, ``torch.compile``, ``torch.compile`` with
``mode="reduce-overhead"``), forward and forward+backward (gradients of X1 and X2, reset to None each step):

* ``call`` : median time of ONE synchronised call (CUDA events around it on CUDA, ``perf_counter`` on CPU);
* ``host`` : host microseconds per call, a loop of calls without synchronising divided by the count;
* ``kernels`` : the kernels alone, back to back (``triton.testing.do_bench`` on CUDA), for comparison;

next to the same measurements of a plain torch elementwise forward+backward of the same size (``X1 * X2`` on
the first M columns), the host-overhead floor of any autograd op. Every variant is checked against the float64
reference before it is timed.

    python benchmarks/overhead.py --device cuda --json overhead.json
    python benchmarks/overhead.py --device cpu
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import sparse_accumulation as sa

CUDA_CASES = (("8x8->8", (8, 8, 8), (1000, 2000)), ("2x2->2", (2, 2, 2), (1000, 2000)),
              ("1x1->2", (1, 1, 2), (100, 100)))
CPU_CASES = (("1x1->1", (1, 1, 1), (10,)), ("8x8->8", (8, 8, 8), (10,)))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def one_call_ms(fn, device, repeats):
    """Median of ``repeats`` single synchronised calls (ms)."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def host_us(fn, device, calls):
    """Host microseconds per call of ``calls`` calls issued without synchronising (median of 5 loops)."""
    results = []
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        results.append((time.perf_counter() - start) / calls * 1e6)
        synchronize(device)
    return statistics.median(results)


def kernels_ms(fn, device):
    if device.type != "cuda":
        return None
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_error(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def measure_case(name, ls, rows, device, repeats, calls, modes):
    l1, l2, L = ls
    m1, m2, mu, C = sa.get_cg_transformation_rule(l1, l2, L, device=device)
    M1, M2, O = 2 * l1 + 1, 2 * l2 + 1, 2 * L + 1
    rule = sa.Rule(m1, m2, mu, O, input_sizes=(M1, M2))
    g = torch.Generator().manual_seed(0)
    X1 = torch.randn(*rows, M1, generator=g).to(device).requires_grad_()
    X2 = torch.randn(*rows, M2, generator=g).to(device).requires_grad_()
    G = torch.randn(*rows, O, generator=g).to(device)
    exact = [t.detach().double().requires_grad_() for t in (X1, X2)]
    reference = sa.reference.index_add(exact[0], exact[1], mu, O, m1, m2, C.double())
    reference_grads = torch.autograd.grad(reference, exact, G.double())

    def forward(a, b):
        return sa.accumulate_rule(a, b, rule, C)

    def plain(a, b):
        return a[..., :min(M1, M2)] * b[..., :min(M1, M2)]

    results = []
    functions = {"eager": forward}
    if "compiled" in modes:
        functions["compiled"] = torch.compile(forward, fullgraph=True)
    if "reduce-overhead" in modes and device.type == "cuda":
        functions["reduce-overhead"] = torch.compile(forward, mode="reduce-overhead", fullgraph=True)
    functions["plain torch"] = plain
    for how, fn in functions.items():
        row = {"case": name, "rows": list(rows), "how": how}

        def fwd():
            return fn(X1, X2)

        def step():
            X1.grad = X2.grad = None
            out = fn(X1, X2)
            out.backward(G if how != "plain torch" else torch.ones_like(out))
            return out

        try:
            for _ in range(3):
                out = step()
            synchronize(device)
            if how != "plain torch":
                errors = [rel_error(out, reference), rel_error(X1.grad, reference_grads[0]),
                          rel_error(X2.grad, reference_grads[1])]
                row["max_rel_error"] = max(errors)
                if not row["max_rel_error"] < 1e-4:
                    row["status"] = "FAILED: wrong result"
                    results.append(row)
                    continue
            row["fwd_call_ms"] = one_call_ms(fwd, device, repeats)
            row["fwd_bwd_call_ms"] = one_call_ms(step, device, repeats)
            row["fwd_host_us"] = host_us(fwd, device, calls)
            row["fwd_bwd_host_us"] = host_us(step, device, calls)
            row["status"] = "ok"
        except Exception as error:  # a mode that fails is reported, not fatal
            row["status"] = f"FAILED: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        results.append(row)
    if device.type == "cuda":
        from sparse_accumulation.kernels import triton_gpu
        from sparse_accumulation.layout import plan

        a, b, g2 = X1.detach(), X2.detach(), G
        rows_plan = plan((a, b), ("X1", "X2"))[1]
        kernel_row = {"case": name, "rows": list(rows), "how": "kernels alone", "status": "ok",
                      "fwd_kernels_ms": kernels_ms(lambda: triton_gpu.accumulate(a, b, None, C, rule, rows_plan),
                                                   device),
                      "fwd_bwd_kernels_ms": kernels_ms(lambda: (
                          triton_gpu.accumulate(a, b, None, C, rule, rows_plan),
                          triton_gpu.accumulate_backward(g2, a, b, None, C, rule, rows_plan, True, True, False,
                                                         False)), device)}
        results.append(kernel_row)
    return results


def fmt(value, digits=3):
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if value < 100 else f"{value:.0f}"


def table(results):
    header = ("case", "rows", "how", "fwd call ms", "fwd+bwd call ms", "fwd host us", "fwd+bwd host us",
              "kernels fwd / fwd+bwd ms", "status")
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for r in results:
        kernels = (f"{fmt(r.get('fwd_kernels_ms'))} / {fmt(r.get('fwd_bwd_kernels_ms'))}"
                   if "fwd_kernels_ms" in r else "")
        lines.append(" | ".join([r["case"], "x".join(map(str, r["rows"])), r["how"], fmt(r.get("fwd_call_ms")),
                                 fmt(r.get("fwd_bwd_call_ms")), fmt(r.get("fwd_host_us"), 1),
                                 fmt(r.get("fwd_bwd_host_us"), 1), kernels, r["status"]]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", default="eager,compiled,reduce-overhead")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cases = CUDA_CASES if device.type == "cuda" else CPU_CASES
    results = []
    for name, ls, rows in cases:
        results += measure_case(name, ls, rows, device, args.repeats, args.calls, args.modes.split(","))
    environment = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device.type == "cuda"
                   else "cpu"}
    try:
        import triton

        environment["triton"] = triton.__version__
    except ImportError:
        pass
    print(environment)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
