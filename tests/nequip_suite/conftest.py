"""NequIP's own test fixtures (the ``conftest.py`` its wheel ships, ``nequip.utils.unittests.CONFTEST_PATH``), for
the child pytest of ``tests/test_nequip.py``: they set process-wide state (float64 default dtype, e3nn's debug
checks), so they never load into this suite's own processes."""
from nequip.utils.unittests import CONFTEST_PATH

exec(compile(CONFTEST_PATH.read_text(), str(CONFTEST_PATH), "exec"))
