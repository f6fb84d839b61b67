"""A process that compiles Triton kernels into Triton's disk cache (see :mod:`.compile_workers`).

Run as a script (``python compile_worker.py [NICENESS]``), so that it imports Triton and the generated kernel modules
only (not torch, not this package). It reads jobs from stdin and answers each on stdout, every message a
pickle behind its 8-byte length. A job names the kernel (the file and module of its generated source, the
function, the arguments it does not specialise on) and what Triton's JIT decided for the call (signature,
constants, attributes, target, options, cache-invalidating environment); the answer is ``("ok", hash)`` of the
compiled kernel or ``("error", message)``. It exits at the end of its input, or after ``IDLE_SECONDS`` without
a job.
"""
import importlib.util
import os
import pickle
import select
import struct
import sys

IDLE_SECONDS = 120.0


def _read_exactly(stream, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = stream.read(left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_message(stream):
    """The next message of ``stream`` (a binary file), or None at its end."""
    header = _read_exactly(stream, 8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    data = _read_exactly(stream, size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def write_message(stream, message) -> None:
    data = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _jit_function(job, functions: dict):
    import triton

    key = (job["path"], job["module"], job["name"], tuple(job["do_not_specialize"]))
    fn = functions.get(key)
    if fn is None:
        module = sys.modules.get(job["module"])
        if module is None:
            spec = importlib.util.spec_from_file_location(job["module"], job["path"])
            module = importlib.util.module_from_spec(spec)
            sys.modules[job["module"]] = module
            spec.loader.exec_module(module)
        fn = functions[key] = triton.jit(getattr(module, job["name"]), do_not_specialize=job["do_not_specialize"])
    return fn


def compile_job(job, functions: dict):
    """Compile one job into Triton's cache; the compiled kernel's hash."""
    import triton
    from triton.compiler.compiler import ASTSource

    fn = _jit_function(job, functions)
    source = ASTSource(fn, job["signature"], job["constants"], job["attrs"])
    return triton.compile(source, target=job["target"], options=job["options"], _env_vars=job["env_vars"]).hash


def main() -> None:
    if len(sys.argv) > 1 and int(sys.argv[1]) > 0:
        os.nice(int(sys.argv[1]))  # a worker for compiles ahead of need: the cores go to others first
    # the protocol keeps file descriptor 1 to itself; anything else printed goes to stderr
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import triton  # noqa: F401 - imported before the first job, while the parent still prepares it

    requests = os.fdopen(0, "rb", buffering=0)  # unbuffered: select sees every byte not yet read
    functions = {}
    write_message(protocol, ("ready", None))
    while True:
        ready, _, _ = select.select([requests], [], [], IDLE_SECONDS)
        if not ready:
            return
        job = read_message(requests)
        if job is None:
            return
        try:
            answer = ("ok", compile_job(job, functions))
        except BaseException as error:  # reported to the parent, which compiles the kernel itself
            answer = ("error", f"{type(error).__name__}: {error}"[-2000:])
        write_message(protocol, answer)


if __name__ == "__main__":
    main()
