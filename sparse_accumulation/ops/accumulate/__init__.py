"""Sparse accumulation: ``out[..., mu[k]] += X1[..., m1[k]] * X2[..., m2[k]] (* W[..., w[k]]) * C[k]``."""
