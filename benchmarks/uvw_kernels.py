"""Time of each kind of fused "uvw" kernel (``sparse_accumulation.kernels.triton.uvw``) over the instructions of a
fully connected product: the forward, the inputs' gradients, the weights' gradient.

    python benchmarks/uvw_kernels.py --rows 100000                     # CUDA, 64x0e + 64x1o + 64x2e, float32

The kernels are launched directly (no autograd, no module), after their compiles, each kind over every
instruction of ``FullyConnectedTensorProduct(IRREPS, IRREPS, IRREPS)``; medians of ``--repeats`` timed calls
(``sparse_accumulation.bench.timing.measure``; on the CPU under ``TRITON_INTERPRET=1`` for checking the script).
"""
from __future__ import annotations

import argparse
import statistics

import torch

from sparse_accumulation.bench.timing import measure


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--irreps", default="64x0e + 64x1o + 64x2e")
    parser.add_argument("--rows", type=int, nargs="+", default=[100000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)

    import sparse_accumulation.e3nn as ours
    from sparse_accumulation.kernels.triton import launch, uvw

    module = ours.FullyConnectedTensorProduct(args.irreps, args.irreps, args.irreps, dtype=torch.float32).to(device)
    specs = [spec for spec in module._factored_specs if spec[11] == 0]
    C = module._factored_coefficients.float().contiguous()
    weight = module.weight.detach().contiguous()
    print(f"# {args.irreps}: {len(specs)} fused instructions, float32, {uvw.precision()} products")
    for rows in args.rows:
        x = torch.randn(rows, module.irreps_in1.dim, device=device)
        y = torch.randn(rows, module.irreps_in2.dim, device=device)
        G = torch.randn(rows, module.irreps_out.dim, device=device)
        out, gx, gy = torch.zeros_like(G), torch.zeros_like(x), torch.zeros_like(y)
        kinds = {
            "forward": lambda: [uvw.forward(x, y, weight, C, out, spec) for spec in specs],
            "inputs' gradients": lambda: [uvw.grad_inputs(x, y, weight, C, G, gx, gy, spec) for spec in specs],
            "weights' gradient": lambda: [uvw.grad_weight(x, y, C, G, spec, rows) for spec in specs],
        }
        with launch.waiting():
            for name, call in kinds.items():
                ms = statistics.median(measure("call", call, device, repeats=args.repeats, warmup=2))
                print(f"  {rows:>9,} rows {name:>18}: {ms:9.2f} ms", flush=True)


if __name__ == "__main__":
    main()
