"""Pair sums: HIP-NN's interaction sums ``envsum``, ``sensesum`` and ``featsum`` over the pairs of atoms."""
