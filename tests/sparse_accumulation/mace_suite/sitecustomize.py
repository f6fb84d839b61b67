"""Put first on ``PYTHONPATH`` (with ``SPARSE_ACCUMULATION_CONVERT_MACE=1``), this makes every MACE model class
convert its models with :func:`sparse_accumulation.mace.accelerate` as its constructor returns, in this process
and in every Python process it starts (MACE's tests run ``run_train.py`` as child processes): MACE's own test
files then test converted models. Used by ``tests/sparse_accumulation/test_mace_own_suite.py``.

Models are converted once, when the outermost constructor of a model returns (a subclass's ``__init__`` calling
its base's converts nothing), and each conversion's class is appended to the file
``SPARSE_ACCUMULATION_CONVERT_MACE_LOG`` names, if any. Models that ``torch.load`` unpickles were converted when
they were made.
"""
import functools
import os
import threading

if os.environ.get("SPARSE_ACCUMULATION_CONVERT_MACE") == "1":
    _building = threading.local()

    def _converting(cls, accelerate):
        original = cls.__init__

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            depth = getattr(_building, "depth", 0)
            _building.depth = depth + 1
            try:
                original(self, *args, **kwargs)
            finally:
                _building.depth = depth
            if depth == 0:
                accelerate(self)
                log = os.environ.get("SPARSE_ACCUMULATION_CONVERT_MACE_LOG")
                if log:
                    with open(log, "a") as f:
                        f.write(f"{type(self).__name__}\n")

        cls.__init__ = __init__

    def _install():
        import torch

        from mace.modules import extensions, models
        from sparse_accumulation.mace import accelerate

        for module in (models, extensions):
            for value in list(vars(module).values()):
                if (isinstance(value, type) and issubclass(value, torch.nn.Module)
                        and value.__module__ == module.__name__ and "__init__" in vars(value)):
                    _converting(value, accelerate)

    _install()
