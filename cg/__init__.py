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
from .bases import BASES as _BASES
from .coefficients import clebsch_gordan
from .rules import transformation_rule
from .tables import CoefficientTable, load_precomputed

#: The basis names that every ``basis=`` argument takes, a tuple in a stable order.
#:
#: * ``"real"``, the default: the real spherical harmonics of Wikipedia, components ``m + l``;
#: * ``"complex"``: the complex (Condon-Shortley) spherical harmonics;
#: * ``"e3nn"``: e3nn's real basis, whose coefficients are ``sqrt(2L+1) * e3nn.o3.wigner_3j(l1, l2, L)``.
#:
#: The same tuple as ``cg.bases.BASES``; :doc:`conventions` describes the three bases.
BASES = _BASES

__all__ = ["BASES", "clebsch_gordan", "transformation_rule", "CoefficientTable", "load_precomputed"]
