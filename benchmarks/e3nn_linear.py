"""What e3nn's ``o3.Linear`` costs against the plain matrix products it computes (one per irrep).

    python benchmarks/e3nn_linear.py                                 # CPU, 10^4 and 10^5 rows
    python benchmarks/e3nn_linear.py --device cuda --rows 100000 1000000

The linear map of ``IRREPS`` (default ``128x0e + 128x1o + 128x2e``, MACE's and NequIP's node features) to
itself, e3nn's ``o3.Linear`` against the same map written as one ``torch.matmul`` per irrep (``[rows (2l+1),
mul] @ [mul, mul]`` on the block's transposed copy; e3nn's weights, its normalization ``1/sqrt(mul_in)``),
outputs concatenated. Both are checked equal (float64), then timed as a training step makes them (inputs and weights
requiring gradients; ``fwd`` and ``fwd+bwd``), median of ``--repeats`` single calls. A ratio near 1 means that
e3nn's Linear costs a model no more than the matrix products themselves, and a counterpart in this library
would gain nothing.
"""
from __future__ import annotations

import argparse
import math
import statistics

import torch

from sparse_accumulation.bench.timing import measure, compiled_kernels_only


def per_irrep(linear):
    """``x -> linear(x)`` as one matrix product per irrep, with ``linear``'s weights (e3nn's layout)."""
    irreps = linear.irreps_in
    blocks, start, offset = [], 0, 0
    for mul, ir in irreps:
        blocks.append((start, mul, ir.dim, offset))
        start += mul * ir.dim
        offset += mul * mul

    def forward(x):
        outs = []
        for start, mul, dim, offset in blocks:
            W = linear.weight[offset:offset + mul * mul].view(mul, mul) / math.sqrt(mul)
            if dim == 1:
                outs.append(x[:, start:start + mul] @ W)
                continue
            # one matrix product over rows and components: [rows * dim, mul] @ [mul, mul]
            block = x[:, start:start + mul * dim].view(-1, mul, dim).transpose(1, 2).reshape(-1, mul)
            outs.append((block @ W).view(-1, dim, mul).transpose(1, 2).reshape(-1, mul * dim))
        return torch.cat(outs, dim=-1)

    return forward


def main(argv=None) -> None:
    compiled_kernels_only()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--irreps", default="128x0e + 128x1o + 128x2e")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    from e3nn import o3

    device = torch.device(args.device)
    check = o3.Linear(args.irreps, args.irreps).to(device=device, dtype=torch.float64)
    x = torch.randn(5, check.irreps_in.dim, device=device, dtype=torch.float64)
    error = (check(x) - per_irrep(check)(x)).abs().max().item()
    print(f"# {args.irreps}: float64 difference {error:.1e}")
    assert error < 1e-10
    linear = o3.Linear(args.irreps, args.irreps).to(device)
    plain = per_irrep(linear)
    for rows in args.rows:
        x = torch.randn(rows, linear.irreps_in.dim, device=device, requires_grad=True)
        G = torch.randn(rows, linear.irreps_out.dim, device=device)
        for mode in ("fwd", "fwd+bwd"):
            times = {}
            for name, f in (("e3nn", linear), ("matmul", plain)):
                def step(f=f):
                    x.grad = linear.weight.grad = None
                    out = f(x)
                    if mode == "fwd+bwd":
                        out.backward(G)
                    return out

                times[name] = statistics.median(measure("call", step, device, repeats=args.repeats, warmup=2))
            print(f"  {rows:>9,} rows {mode:>8}: e3nn {times['e3nn']:9.3f} ms, matmul per irrep "
                  f"{times['matmul']:9.3f} ms, e3nn / matmul {times['e3nn'] / times['matmul']:.2f}", flush=True)


if __name__ == "__main__":
    main()
