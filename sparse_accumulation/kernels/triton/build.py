"""Turning generated source into Triton kernels, once per (rule, kernel kind, layout, dtype, strategy).

``triton.jit`` reads a function's source through ``inspect``, so the generated source is written (atomically)
to a file in a cache folder (``SPARSE_ACCUMULATION_TRITON_CACHE``, default a per-user folder in the temporary
directory) and imported from there. Integer arguments (row count, strides) are not specialised on their
values (``do_not_specialize``): what matters of them is in the :class:`~.source.Layout`, which is part of the
source, so one compiled kernel serves every call of a layout and the launcher can reuse it without Triton's
per-call argument analysis. ``triton.jit`` decides when a kernel is created whether it runs under the
interpreter (``TRITON_INTERPRET=1``), so the flag is part of the cache key.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

import triton

from . import configs

_kernels = {}
_lock = threading.Lock()


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


_TRUE = frozenset(("1", "true", "on", "yes"))


def cache_dir() -> str:
    path = os.environ.get("SPARSE_ACCUMULATION_TRITON_CACHE")
    if not path:
        try:
            user = str(os.getuid())
        except AttributeError:  # pragma: no cover - not POSIX
            user = "user"
        path = os.path.join(tempfile.gettempdir(), f"sparse_accumulation_triton_{user}")
    os.makedirs(path, exist_ok=True)
    return path


def load_function(source: str, name: str):
    """Write ``source`` to ``<cache>/sparse_accumulation_triton_<hash>.py`` (atomically) and import ``name``."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    module_name = f"sparse_accumulation_triton_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        path = os.path.join(cache_dir(), module_name + ".py")
        current = None
        if os.path.exists(path):
            with open(path) as f:
                current = f.read()
        if current != source:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=module_name, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return getattr(module, name)


def kernel_name(kind: str, key) -> str:
    return f"sparse_accumulation_{kind}_{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"


def cached(key: tuple, build):
    """The kernel of ``key``, built by ``build()`` on first use (``key`` includes the interpreter flag)."""
    key = key + (interpreting(), configs.AUTOTUNE)
    kernel = _kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = _kernels.get(key)
            if kernel is None:
                kernel = _kernels[key] = build()
    return kernel


def autotuned_row_kernel(source: str, name: str, ints, pairs, store_flags):
    """The generated row kernel ``name`` autotuned over ``(BLOCK_R, num_warps)`` pairs and ``STORE_TILE`` flags,
    keyed on the ``R_BUCKET`` argument (and the argument dtypes)."""
    fn = triton.jit(load_function(source, name), do_not_specialize=list(ints))
    candidates = [triton.Config({"BLOCK_R": b, "STORE_TILE": t}, num_warps=w) for t in store_flags for b, w in pairs]
    return triton.autotune(configs=candidates, key=["R_BUCKET"])(fn)


def fixed_kernel(source: str, name: str, ints, constexprs: dict, num_warps: int):
    """The generated kernel ``name`` with one fixed configuration (an autotuner of one configuration, so it is
    launched like the row kernels and never benchmarked)."""
    fn = triton.jit(load_function(source, name), do_not_specialize=list(ints))
    return triton.autotune(configs=[triton.Config(constexprs, num_warps=num_warps, num_stages=1)], key=[])(fn)
