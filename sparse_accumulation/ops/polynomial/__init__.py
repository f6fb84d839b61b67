"""Element-weighted polynomials (MACE's symmetric contraction): the outputs of a program."""
