"""Packaging for sparse-accumulation: Clebsch-Gordan coefficients and fast sparse accumulation ops."""
from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="sparse-accumulation",
    version="0.1.0",
    description=(
        "Fast, correct Clebsch-Gordan products for equivariant networks: "
        "CG coefficient generator and differentiable sparse accumulation ops (numba CPU, Triton GPU)."
    ),
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=find_packages(include=["cg", "cg.*", "sparse_accumulation", "sparse_accumulation.*"]),
    package_data={"cg": ["data/*.npz"]},
    install_requires=[
        "numpy>=1.24",
        "sympy>=1.12",
        "torch>=2.6",  # torch.library.triton_op and wrap_triton
        "numba>=0.59",
        # progress bars of the command lines; small, pure Python, no dependencies of its own
        "tqdm>=4.60",
    ],
    extras_require={
        "plot": ["matplotlib>=3.7"],  # the charts of `sparse-accumulation bench --output DIR`
        # the GPU kernels (torch's CUDA wheels for Linux bring triton already; a CPU-only install needs none of it)
        "gpu": ["triton>=3.0; platform_system == 'Linux'"],
        # pytest-xdist: the suites run on two processes (pyproject's addopts)
        # triton: the GPU kernels' tests run in its interpreter on the CPU (TRITON_INTERPRET=1)
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "e3nn>=0.5", "sphinx>=7", "matplotlib>=3.7",
                 "triton>=3.0; platform_system == 'Linux'",
                 "hippynn>=0.1.3", "opt_einsum_fx>=0.1.4"],
        # what mace-torch's models, data pipeline, ASE calculator and training command (run_train) import;
        # mace-torch itself goes in with `pip install --no-deps mace-torch` (it pins e3nn 0.4.4)
        "mace": ["e3nn>=0.5", "opt_einsum_fx>=0.1.4", "ase>=3.23", "torch-ema>=0.3", "torchmetrics>=1.0",
                 "pandas>=2.0", "matscipy>=1.0", "h5py>=3.8", "lmdb>=1.4", "orjson>=3.8", "prettytable>=3",
                 "configargparse>=1.5", "GitPython>=3", "python-hostlist>=1.21", "PyYAML>=6"],
        # NequIP and Allegro models on the library's kernels (sparse_accumulation.nequip, sparse_accumulation.allegro)
        "nequip": ["nequip>=0.19", "nequip-allegro>=0.8"],
    },
    entry_points={"console_scripts": ["sparse-accumulation = sparse_accumulation.cli:main"],
                  # NequIP imports these when it is imported: the model modifiers enable_SparseAccumulation and
                  # (with Allegro) enable_SparseAccumulationContracter
                  "nequip.extension": ["init_always = sparse_accumulation.nequip.extension"]},
)
