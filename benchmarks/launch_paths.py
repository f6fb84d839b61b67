"""Host cost of the ways to launch a Triton kernel, on the installed torch/Triton (CUDA).

A one-line copy kernel, launched 2000 times without synchronising, through ``kernel[grid](...)`` (Triton's
launcher), through ``triton.autotune`` (two configurations), and directly through the compiled kernel's
launcher (what :mod:`sparse_accumulation.kernels.triton.launch` does after the first call). Prints host
microseconds per launch.

    python benchmarks/launch_paths.py
"""
import time

import torch
import triton
import triton.language as tl


def host_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


@triton.jit
def copy_kernel(X, Y, R, s0, s1, t0, t1, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    mask = rows < R
    tl.store(Y + rows * t0, tl.load(X + rows * s0, mask=mask), mask=mask)


def main():
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    autotuned = triton.autotune([triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=4)],
                                key=["R"])(copy_kernel)
    x = torch.randn(1000, 4, device="cuda")
    y = torch.empty_like(x)
    R = 1000
    compiled = copy_kernel.run(x, y, R, 4, 1, 4, 1, BLOCK=64, grid=(16,), warmup=False)
    function, metadata = compiled.function, compiled.packed_metadata
    results = {
        "kernel[grid](...)": host_us(lambda: copy_kernel[(16,)](x, y, R, 4, 1, 4, 1, BLOCK=64)),
        "triton.autotune, grid from meta": host_us(
            lambda: autotuned[lambda meta: (triton.cdiv(R, meta["BLOCK"]),)](x, y, R, 4, 1, 4, 1)),
        "compiled kernel's launcher": host_us(
            lambda: compiled.run(16, 1, 1, torch._C._cuda_getCurrentRawStream(0), function, metadata, None, None,
                                 None, x, y, R, 4, 1, 4, 1, 64)),
        "torch.empty(1000, 17)": host_us(lambda: torch.empty((1000, 17), device="cuda")),
    }
    y.zero_()
    compiled.run(16, 1, 1, torch._C._cuda_getCurrentRawStream(0), function, metadata, None, None, None,
                 x, y, R, 4, 1, 4, 1, 64)
    torch.cuda.synchronize()
    assert torch.equal(y[:, 0], x[:, 0]), "the direct launch did not copy"
    for name, us in results.items():
        print(f"{name:35s} {us:6.1f} us")


if __name__ == "__main__":
    main()
