"""Orthogonality and completeness of the CG matrices in every basis."""
import numpy as np
import pytest

import cg

LMAX = 5


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
@pytest.mark.parametrize("l1", range(LMAX + 1))
def test_orthogonality_and_completeness(basis, l1):
    for l2 in range(LMAX + 1):
        blocks = []
        for L in range(abs(l1 - l2), l1 + l2 + 1):
            C = cg.clebsch_gordan(l1, l2, L, basis=basis)
            flat = C.reshape(-1, 2 * L + 1)
            # sum_{m1,m2} C[m1,m2,M] C[m1,m2,M'] = delta_{MM'}
            np.testing.assert_allclose(flat.T @ flat, np.eye(2 * L + 1), atol=1e-13)
            blocks.append(flat)
        # completeness: stacking all (L, M) columns gives a square orthogonal matrix
        full = np.concatenate(blocks, axis=1)
        n = (2 * l1 + 1) * (2 * l2 + 1)
        assert full.shape == (n, n)
        np.testing.assert_allclose(full @ full.T, np.eye(n), atol=1e-13)


def test_e3nn_is_real_up_to_a_sign_per_triple():
    # U_e3nn = i^l U_real and the real rule carries +i for odd n = l1 + l2 - L, so
    # C_e3nn = (-1)^ceil(n/2) C_real exactly.
    for l1 in range(LMAX + 1):
        for l2 in range(LMAX + 1):
            for L in range(abs(l1 - l2), l1 + l2 + 1):
                n = l1 + l2 - L
                sign = -1.0 if ((n + 1) // 2) % 2 else 1.0
                np.testing.assert_array_equal(
                    cg.clebsch_gordan(l1, l2, L, basis="e3nn"), sign * cg.clebsch_gordan(l1, l2, L, basis="real")
                )


@pytest.mark.parametrize("basis", ["real", "complex", "e3nn"])
def test_basis_matrices_unitary(basis):
    from cg.bases import basis_matrix

    for l in range(7):
        U = basis_matrix(l, basis)
        np.testing.assert_allclose(U @ U.conj().T, np.eye(2 * l + 1), atol=1e-15)
        # only m and -m mix
        rows, cols = np.nonzero(U)
        assert np.all(np.abs(rows - l) == np.abs(cols - l))
