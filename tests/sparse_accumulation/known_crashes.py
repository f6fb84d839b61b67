"""Crashes of torch itself that tests may report as expected failures, each matched precisely."""
import signal
import subprocess


def aoti_load_crash(result: subprocess.CompletedProcess) -> bool:
    """Whether a child that compiled an AOTInductor package and then loaded it died of the known crash of
    torch's package loader (torch 2.11.0+cu130 on an H200 host, for every package, a plain ``(x * 2).sin()`` one
    on the CPU too): a segmentation fault inside
    ``torch._inductor.aoti_load_package``, after the child printed ``compiled`` and before ``loaded``. The
    child must run with ``faulthandler`` enabled, which writes the Python frames of the crash to stderr."""
    return (result.returncode == -signal.SIGSEGV and result.stdout.split() == ["compiled"]
            and "Fatal Python error: Segmentation fault" in result.stderr
            and " in aoti_load_package\n" in result.stderr)
