"""The first training step of ``benchmarks/model_step.py``'s model under ``torch.compile`` (default mode), and how
much of it is torch's analysis of user Triton kernels (``generate_ttir``, run to find what a kernel writes).

    python benchmarks/compiled_first_step.py --backend ours
    python benchmarks/compiled_first_step.py --backend e3nn           # the floor: the same model on e3nn
    python benchmarks/compiled_first_step.py --backend ours --memoize-ttir

Run each in a fresh process with empty caches (``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``,
``SPARSE_ACCUMULATION_TRITON_CACHE``). ``--memoize-ttir`` answers repeated analyses of one kernel with the same
argument types from memory (an experiment on a private torch function, not something the library does).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _timed_analysis(memoize: bool) -> dict:
    from torch._higher_order_ops import triton_kernel_wrap

    original = triton_kernel_wrap.generate_ttir
    stats = {"calls": 0, "seconds": 0.0, "kernels": set(), "memoised": 0}
    memo = {}

    def key_of(kernel, kwargs):
        parts = []
        for name, value in sorted(kwargs.items()):
            if isinstance(value, torch.Tensor):
                parts.append((name, str(value.dtype)))
            elif hasattr(value, "get_dtype"):  # inductor's buffers
                parts.append((name, str(value.get_dtype())))
            else:
                parts.append((name, repr(value)[:80]))
        return id(kernel), tuple(parts)

    def generate_ttir(kernel, kwargs, *args, **kw):
        key = key_of(kernel, kwargs)
        stats["calls"] += 1
        if memoize and key in memo:
            stats["memoised"] += 1
            return memo[key]
        start = time.perf_counter()
        result = original(kernel, kwargs, *args, **kw)
        stats["seconds"] += time.perf_counter() - start
        stats["kernels"].add(key)
        if memoize:
            memo[key] = result
        return result

    triton_kernel_wrap.generate_ttir = generate_ttir
    return stats


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="ours", choices=("ours", "e3nn"))
    parser.add_argument("--molecules", type=int, default=1)
    parser.add_argument("--memoize-ttir", action="store_true")
    args = parser.parse_args(argv)
    import model_step
    from sparse_accumulation.bench.timing import compiled_kernels_only

    compiled_kernels_only()
    stats = _timed_analysis(args.memoize_ttir)
    example = model_step._example()
    batch, src, dst = model_step.make_batch(example, args.molecules, "cuda")
    torch.manual_seed(0)
    model = example.Potential(model_step.CONFIG, args.backend).to("cuda")
    step = model_step.make_step(example, model, "train", "default", batch, src, dst)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    print(f"backend {args.backend}: first step {seconds[0]:.1f} s, second {seconds[1] * 1e3:.1f} ms; TTIR analyses "
          f"{stats['calls']} ({len(stats['kernels'])} distinct, {stats['memoised']} from memory) taking "
          f"{stats['seconds']:.1f} s")


if __name__ == "__main__":
    main()
