"""Only the known crash of torch's AOTInductor loader counts as an expected failure of the AOTInductor test;
the crashes are made in real child processes."""
import subprocess
import sys

from known_crashes import aoti_load_crash

_FAULT = "import ctypes, faulthandler, os, signal\nfaulthandler.enable()\n"


def _child(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _FAULT + body], capture_output=True, text=True, timeout=60)


def test_the_segfault_inside_the_loader_after_compiling_is_known():
    result = _child("def aoti_load_package(path):\n    ctypes.string_at(0)\n"
                    "print('compiled', flush=True)\naoti_load_package('model.pt2')\nprint('loaded')\n")
    assert aoti_load_crash(result)


def test_other_failures_are_not():
    crash = "ctypes.string_at(0)\n"
    others = [
        # a segmentation fault while compiling
        "def aoti_compile_and_package(program):\n    " + crash + "aoti_compile_and_package(None)\n",
        # after compiling, but elsewhere than in the loader
        "print('compiled', flush=True)\ndef run(package):\n    " + crash + "run(None)\n",
        # another signal inside the loader
        "def aoti_load_package(path):\n    os.kill(os.getpid(), signal.SIGABRT)\n"
        "print('compiled', flush=True)\naoti_load_package('model.pt2')\n",
        # an error inside the loader
        "def aoti_load_package(path):\n    raise RuntimeError('bad package')\n"
        "print('compiled', flush=True)\naoti_load_package('model.pt2')\n",
        # the loader returned; the crash came later
        "def aoti_load_package(path):\n    return path\n"
        "print('compiled', flush=True)\naoti_load_package('model.pt2')\nprint('loaded', flush=True)\n" + crash,
    ]
    for body in others:
        result = _child(body)
        assert result.returncode != 0
        assert not aoti_load_crash(result), body
