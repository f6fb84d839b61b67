"""Clebsch-Gordan coefficients for SO(3) couplings (numpy + sympy only).

Public API:

* :func:`clebsch_gordan` - dense coefficient arrays in the ``"complex"``, ``"real"`` or
  ``"e3nn"`` basis, as floats or exact sympy numbers;
* :func:`transformation_rule` - the flattened sparse rule ``(m1, m2, mu, C)``;
* :class:`CoefficientTable` / :func:`load_precomputed` - tables of all rules up to ``lmax``,
  saved as ``.npz`` files;
* :data:`BASES` - the supported basis names.

Command line: ``python -m cg tables ...`` and ``python -m cg show ...``.
"""
from .bases import BASES
from .coefficients import clebsch_gordan
from .rules import transformation_rule
from .tables import CoefficientTable, load_precomputed

__all__ = ["BASES", "clebsch_gordan", "transformation_rule", "CoefficientTable", "load_precomputed"]
