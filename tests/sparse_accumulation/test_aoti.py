"""AOTInductor on the CPU: export_for_aoti replaces the rule ops by aten ops; the package runs in a process that
cannot import sparse_accumulation, from Python and from the C++ example, with the eager model's values."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation.export import decompositions, export_for_aoti
from products_helpers import PathAndProduct, path_and_product_inputs

o3 = pytest.importorskip("e3nn.o3")
from sparse_accumulation.e3nn import TensorProduct  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# a child that cannot import sparse_accumulation, so that the package alone must compute the values
BLOCKED = ("import sys\n"
           "class Blocked:\n"
           "    def find_spec(self, name, path=None, target=None):\n"
           "        if name.partition('.')[0] == 'sparse_accumulation':\n"
           "            raise ImportError('sparse_accumulation is blocked in this process')\n"
           "sys.meta_path.insert(0, Blocked())\n")


def _relative(a, b):
    return float((a.detach() - b.detach()).abs().max() / b.detach().abs().max())


class _Layers(torch.nn.Module):
    """A message-passing tensor product of ``4x0e + 4x1o`` with the edges' harmonics, the radial network
    of its per-edge weights (from the edge length) and the harmonics."""

    irreps = o3.Irreps("4x0e + 4x1o")

    def __init__(self):
        super().__init__()
        instructions = [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 1, "uvu", True),
                        (1, 1, 0, "uvu", True)]
        self.tp = TensorProduct(self.irreps, "0e + 1o", self.irreps, instructions, shared_weights=False,
                                internal_weights=False, dtype=torch.float64)
        self.sh = o3.SphericalHarmonics("0e + 1o", normalize=True, normalization="component")
        self.radial = torch.nn.Linear(3, self.tp.weight_numel, dtype=torch.float64)

    def nodes(self, features, positions, src, dst):
        vectors = positions[dst] - positions[src]
        lengths = vectors.pow(2).sum(-1, keepdim=True).sqrt()
        weights = self.radial(torch.cat([lengths, lengths.cos(), lengths.sin()], dim=-1))
        return self.tp(features, self.sh(vectors), weights, indices_1=src, indices_out=dst,
                       size_out=positions.shape[0])


class Interaction(_Layers):
    """Energy of a message-passing tensor product over fixed edges, and with ``forces`` minus its gradient."""

    def __init__(self, forces: bool, nodes: int = 5):
        super().__init__()
        self.features = torch.nn.Parameter(torch.randn(nodes, self.irreps.dim, dtype=torch.float64))
        pairs = [(i, j) for i in range(nodes) for j in range(nodes) if i != j]
        self.register_buffer("src", torch.tensor([i for i, _ in pairs]))
        self.register_buffer("dst", torch.tensor([j for _, j in pairs]))
        self.forces = forces

    def energy(self, positions):
        return self.nodes(self.features, positions, self.src, self.dst)[:, :4].tanh().sum()

    def forward(self, positions):
        if not self.forces:
            return self.energy(positions)
        positions = positions.detach().requires_grad_(True)
        energy = self.energy(positions)
        return energy, -torch.autograd.grad([energy], [positions])[0]


def _no_library_ops(program):
    return not any(str(node.target).startswith("sparse_accumulation.")
                   for node in program.graph.nodes if node.op == "call_function")


@pytest.mark.parametrize("weighted", [False, True])
def test_decompositions_match_the_kernels_forward_and_backward(generator, weighted):
    m1, m2, mu, C = sa.get_cg_transformation_rule(2, 1, 2, dtype=torch.float64)
    w = torch.randint(0, 3, (len(C),), generator=generator) if weighted else None
    rule = sa.Rule(m1, m2, mu, 5, input_sizes=(5, 3), w=w, weight_size=3 if weighted else None)
    X1 = torch.randn(4, 1, 5, generator=generator, dtype=torch.float64)
    X2 = torch.randn(1, 6, 3, generator=generator, dtype=torch.float64)
    W = torch.randn(4, 6, 3, generator=generator, dtype=torch.float64) if weighted else None
    G = torch.randn(4, 6, 5, generator=generator, dtype=torch.float64)
    ops = torch.ops.sparse_accumulation
    table = decompositions()
    args = (X1, X2, W, C, rule.key, "numba")
    assert _relative(table[ops.accumulate.default](*args), ops.accumulate(*args)) <= 1e-12
    wanted = (True, True, weighted, True)
    got = table[ops.accumulate_backward.default](G, *args, *wanted)
    expected = ops.accumulate_backward(G, *args, *wanted)
    for a, b, want in zip(got, expected, wanted):
        assert a.shape == b.shape
        if want:
            assert _relative(a, b) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decompositions_of_16_bit_operands_compute_in_float32(generator, dtype):
    """16-bit operands: products and sums in float32, rounded once (as the kernels do), so that every output and
    gradient is within half a unit in the last place (and float32's rounding) of the float64 result of the same
    rounded inputs (summed in the 16-bit dtype, some are several units off)."""
    m1, m2, mu, C = sa.get_cg_transformation_rule(8, 8, 8, dtype=torch.float64)
    rule = sa.Rule(m1, m2, mu, 17, input_sizes=(17, 17))
    X1, X2, G = (torch.randn(64, 17, generator=generator, dtype=torch.float64).to(dtype) for _ in range(3))
    C = C.to(dtype)
    ops = torch.ops.sparse_accumulation
    table = decompositions()
    args = (X1, X2, None, C, rule.key, "numba")
    exact = (X1.double(), X2.double(), None, C.double(), rule.key, "numba")
    got = [table[ops.accumulate.default](*args)]
    expected = [ops.accumulate(*exact)]
    got += table[ops.accumulate_backward.default](G, *args, True, True, False, True)[:2]
    expected += ops.accumulate_backward(G.double(), *exact, True, True, False, True)[:2]
    for a, b in zip(got, expected):
        assert a.dtype == dtype
        bound = b.abs() * (torch.finfo(dtype).eps / 2 + 1e-6) + torch.finfo(dtype).tiny
        assert ((a.double() - b).abs() <= bound).all()


def test_export_for_aoti_leaves_no_library_op_and_keeps_dynamic_rows(generator):
    model = PathAndProduct()
    batch = torch.export.Dim("batch", min=2)
    program = export_for_aoti(model, path_and_product_inputs(generator, 6),
                              dynamic_shapes=({0: batch}, {0: batch}, {0: batch}))
    assert _no_library_ops(program)
    for rows in (3, 17):
        inputs = path_and_product_inputs(generator, rows)
        assert _relative(program.module()(*inputs), model(*inputs)) <= 1e-12


@pytest.mark.parametrize("schedule", ["per edge", "fused"])
def test_export_for_aoti_with_forces(generator, schedule, monkeypatch):
    """Both message-passing schedules: the row op per edge, or the fused graph op (its decomposition called)."""
    from sparse_accumulation import export
    from sparse_accumulation.e3nn import tensor_product

    monkeypatch.setattr(tensor_product, "FUSED_MIN_CHANNELS", 1 << 30 if schedule == "per edge" else 0)
    graph_calls = []
    original = export._graph_accumulate
    monkeypatch.setattr(export, "_graph_accumulate", lambda *a: graph_calls.append(1) or original(*a))
    model = Interaction(forces=True)
    positions = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    program = export_for_aoti(model, (positions,), trace_autograd=True)
    assert _no_library_ops(program)
    assert bool(graph_calls) == (schedule == "fused")
    other = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    for got, expected in zip(program.module()(other), model(other)):
        assert _relative(got, expected) <= 1e-12


class GraphInteraction(_Layers):
    """Energy and forces of a message-passing tensor product over edges given as inputs (as molecular
    dynamics gives its neighbour lists), node features from the node count: every size is an input's."""

    def __init__(self, branch_on_nodes: bool = False, edges_as_int: bool = False):
        super().__init__()
        self.embedding = torch.nn.Linear(1, self.irreps.dim, dtype=torch.float64)
        self.branch_on_nodes, self.edges_as_int = branch_on_nodes, edges_as_int

    def forward(self, positions, src, dst):
        positions = positions.detach().requires_grad_(True)
        features = self.embedding(positions.new_ones(positions.shape[0], 1))
        energy = self.nodes(features, positions, src, dst)[:, :4].tanh().sum()
        if self.branch_on_nodes and positions.shape[0] > 6:  # a decision on a size: refused when it is dynamic
            energy = 2 * energy
        if self.edges_as_int:  # a size made a Python int: refused when it is dynamic
            energy = energy * (int(src.shape[0]) ** 0)
        return energy, -torch.autograd.grad([energy], [positions])[0]


def _molecule(generator, atoms):
    pairs = [(i, j) for i in range(atoms) for j in range(atoms) if i != j]
    return (torch.randn(atoms, 3, generator=generator, dtype=torch.float64),
            torch.tensor([i for i, _ in pairs]), torch.tensor([j for _, j in pairs]))


@pytest.mark.parametrize("schedule", ["per edge", "fused"])
def test_export_for_aoti_with_forces_and_dynamic_atoms_and_edges(generator, schedule, monkeypatch):
    from sparse_accumulation.e3nn import tensor_product

    monkeypatch.setattr(tensor_product, "FUSED_MIN_CHANNELS", 1 << 30 if schedule == "per edge" else 0)
    model = GraphInteraction()
    atoms, edges = torch.export.Dim("atoms", min=2), torch.export.Dim("edges", min=2)
    program = export_for_aoti(model, _molecule(generator, 5), trace_autograd=True,
                              dynamic_shapes=({0: atoms}, {0: edges}, {0: edges}))
    assert _no_library_ops(program)
    for count in (3, 9):  # other atom and edge counts than the trace's
        inputs = _molecule(generator, count)
        for got, expected in zip(program.module()(*inputs), model(*inputs)):
            assert got.shape == expected.shape and _relative(got, expected) <= 1e-12


def test_export_for_aoti_rejects_what_it_cannot_do(generator):
    atoms, edges = torch.export.Dim("atoms", min=2), torch.export.Dim("edges", min=2)
    with pytest.raises(ValueError, match="depends on the dynamic size of argument 0, dimension 0"):
        export_for_aoti(GraphInteraction(branch_on_nodes=True), _molecule(generator, 5), trace_autograd=True,
                        dynamic_shapes=({0: atoms}, {0: edges}, {0: edges}))
    with pytest.raises(ValueError, match="made the dynamic size of argument 1, dimension 0 the constant 20"):
        export_for_aoti(GraphInteraction(edges_as_int=True), _molecule(generator, 5), trace_autograd=True,
                        dynamic_shapes=({0: atoms}, {0: edges}, {0: edges}))

    class Indexed(torch.nn.Module):  # the tensor API: index tensors as data, no decomposition
        def forward(self, X1, X2):
            m1, m2, mu, C = sa.get_cg_transformation_rule(1, 1, 1, dtype=torch.float64)
            return sa.accumulate(X1, X2, mu, 3, m1, m2, C)

    X = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="accumulate_indexed"):
        export_for_aoti(Indexed(), (X, X))


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The AOTInductor package of the energy-and-forces model (one package: compiling one takes about a
    minute on two cores), its inputs and the eager values (numba kernels)."""
    folder = tmp_path_factory.mktemp("aoti")
    generator = torch.Generator().manual_seed(7)
    positions = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    torch.manual_seed(7)
    model = Interaction(True)
    program = export_for_aoti(model, (positions,), trace_autograd=True)
    path = str(folder / "forces.pt2")
    torch._inductor.aoti_compile_and_package(program, package_path=path)
    made = {True: (path, model(positions))}
    torch.save(positions, folder / "positions.pt")
    return folder, positions, made


@pytest.mark.slow
def test_package_runs_without_sparse_accumulation(packages):
    folder, _, made = packages
    path, expected = made[True]
    code = BLOCKED + (f"import torch\n"
                      f"loaded = torch._inductor.aoti_load_package({path!r})\n"
                      f"outputs = loaded(torch.load({str(folder / 'positions.pt')!r}))\n"
                      f"outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]\n"
                      f"assert 'sparse_accumulation' not in sys.modules\n"
                      f"torch.save([o.detach() for o in outputs], {str(folder / 'outputs.pt')!r})\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = torch.load(folder / "outputs.pt")
    assert len(outputs) == len(expected)
    for got, value in zip(outputs, expected):
        assert _relative(got, value) <= 1e-12


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None or not any(shutil.which(c) for c in ("c++", "g++", "clang++")),
                    reason="needs cmake and a C++ compiler")
def test_cpp_example_prints_the_energy(packages, tmp_path):
    _, positions, made = packages
    path, (energy, _) = made[True]
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ROOT / "examples" / "aoti_loader"), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"], check=True, capture_output=True,
                   timeout=300)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1)], check=True,
                   capture_output=True, timeout=600)
    inputs = tmp_path / "inputs.txt"
    inputs.write_text(f"{positions.dim()} {' '.join(map(str, positions.shape))}\n"
                      + " ".join(repr(float(v)) for v in positions.reshape(-1)) + "\n")
    result = subprocess.run([str(build / "aoti_loader"), path, str(inputs)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert abs(float(result.stdout.split()[0]) - float(energy)) <= 1e-12 * abs(float(energy))


class Contraction(torch.nn.Module):
    """Energy of MACE's symmetric contraction of node features made from positions, and minus its gradient."""

    def __init__(self, generator, nodes: int = 6):
        super().__init__()
        from sparse_accumulation.mace import SymmetricContraction

        self.contraction = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 3, num_elements=3, dtype=torch.float64)
        with torch.no_grad():
            for p in self.contraction.parameters():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
        self.register_buffer("elements", torch.arange(nodes) % 3)

    def forward(self, positions):
        positions = positions.detach().requires_grad_(True)
        # [nodes, 2 channels, 0e + 1o] features of the positions
        x = torch.cat([positions.pow(2).sum(-1, keepdim=True), positions], dim=-1)
        x = torch.stack([x, x.sin()], dim=1)
        energy = self.contraction(x, self.elements).tanh().sum()
        return energy, -torch.autograd.grad([energy], [positions])[0]


class PairSums(torch.nn.Module):
    """Energy of HIP-NN's interaction sums over all ordered pairs, and minus its gradient."""

    def __init__(self, nodes: int = 5):
        super().__init__()
        pairs = [(i, j) for i in range(nodes) for j in range(nodes) if i != j]
        self.register_buffer("first", torch.tensor([i for i, _ in pairs]))
        self.register_buffer("second", torch.tensor([j for _, j in pairs]))

    def forward(self, positions):
        positions = positions.detach().requires_grad_(True)
        distances = (positions[self.first] - positions[self.second]).pow(2).sum(-1, keepdim=True).sqrt()
        sensitivities = torch.cat([(-distances).exp(), 1 / (1 + distances)], dim=-1)
        env = sa.envsum(sensitivities, positions.sin(), self.first, self.second)
        energy = env.tanh().sum()
        return energy, -torch.autograd.grad([energy], [positions])[0]


@pytest.mark.parametrize("make", [Contraction, lambda generator: PairSums()],
                         ids=["symmetric contraction", "pair sums"])
def test_export_for_aoti_of_contractions_and_pair_sums_with_forces(generator, make):
    model = make(generator)
    positions = torch.randn(6 if isinstance(model, Contraction) else 5, 3, generator=generator, dtype=torch.float64)
    program = export_for_aoti(model, (positions,), trace_autograd=True)
    assert _no_library_ops(program)
    other = torch.randn(positions.shape, generator=generator, dtype=torch.float64)
    (energy, forces), (expected_energy, expected_forces) = program.module()(other), model(other)
    # the energy is a sum of terms that may cancel: its error is measured against the terms' scale (tanh: 1, and
    # the pair sums' terms are of order 1 too), not against the sum
    assert abs(float(energy - expected_energy)) <= 1e-12 * max(1.0, float(expected_energy.abs()))
    assert _relative(forces, expected_forces) <= 1e-12
