"""TorchScript: the public modules script with ``torch.jit.script`` inside models that compute forces with
``torch.autograd.grad``; the scripted models give the eager models' energies, forces and training gradients
(float64, relative 1e-12), e3nn's and MACE's where those modules exist, and the same again when saved and loaded
in a fresh Python process. Modules: e3nn's ``TensorProduct`` drop-in (with and without message-passing indices,
both CPU schedules), MACE's ``SymmetricContraction`` (also inside a whole MACE model scripted by MACE's own
``jit.compile``), ``CGCalculatorSingle``, ``ClebschGordanProduct`` and ``ClebschGordanIteration``, and the pair
sums, called from scripted code and inside hippynn's interaction layer."""
import importlib.util
import os
import subprocess
import sys
import textwrap
from typing import Tuple

import pytest
import torch

import sparse_accumulation as sa
from sparse_accumulation import CGCalculatorSingle, ClebschGordanIteration, ClebschGordanProduct
from sparse_accumulation.mace import SymmetricContraction

# torch 2.10 and later deprecate TorchScript (it still works; torch.compile and torch.export are its successors)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning")

RTOL = 1e-12
NODES, EDGES = 6, 20


def relative(a, b) -> float:
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale else 1.0)


def assert_close(a, b, what, rtol=RTOL):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert relative(a, b) <= rtol, f"{what}: relative error {relative(a, b):.3g}"


def edge_basis(positions: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, count: int) -> Tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """Edge vectors and ``count`` radial functions of their lengths."""
    vectors = positions[dst] - positions[src]
    lengths = (vectors * vectors).sum(-1, keepdim=True).sqrt()
    frequencies = torch.arange(1, count + 1, dtype=positions.dtype, device=positions.device)
    return vectors, torch.sin(lengths * frequencies) / lengths


class Forces(torch.nn.Module):
    """An energy model's energy and forces ``-dE/dpositions`` (as MACE computes them: ``torch.autograd.grad`` in
    the forward, ``create_graph`` to train on forces)."""

    def __init__(self, energy: torch.nn.Module):
        super().__init__()
        self.energy = energy

    def forward(self, positions: torch.Tensor, create_graph: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        positions = positions.detach().requires_grad_(True)
        energy = self.energy(positions)
        gradient = torch.autograd.grad([energy], [positions], create_graph=create_graph)[0]
        if gradient is None:
            raise RuntimeError("the energy does not depend on the positions")
        return energy, -gradient


class Convolution(torch.nn.Module):
    """An interaction of e3nn's kind: node features times the edges' spherical harmonics, weighted per edge by a
    radial function, summed into the destination nodes (by ``index_add``, or by the product's indices)."""

    def __init__(self, tp, sh, src, dst, indexed: bool, generator):
        super().__init__()
        self.tp, self.sh, self.indexed = tp, sh, indexed
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        self.features = torch.nn.Parameter(torch.randn(NODES, tp.irreps_in1.dim, generator=generator,
                                                       dtype=torch.float64))
        self.radial = torch.nn.Parameter(torch.randn(4, tp.weight_numel, generator=generator, dtype=torch.float64))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        vectors, basis = edge_basis(positions, self.src, self.dst, 4)
        Y, weight = self.sh(vectors), basis @ self.radial
        if self.indexed:
            out = self.tp(self.features, Y, weight, indices_1=self.src, indices_out=self.dst,
                          size_out=positions.shape[0])
        else:
            messages = self.tp(self.features[self.src], Y, weight)
            out = messages.new_zeros(positions.shape[0], messages.shape[1]).index_add(0, self.dst, messages)
        return torch.tanh(out).sum()


class Density(torch.nn.Module):
    """MACE's product basis: a density ``A [nodes, channels, 1 + 3]`` of the neighbours (radial functions times
    ``(1, unit vector)``), then the symmetric contraction for node attributes ``attributes``."""

    def __init__(self, contraction, src, dst, attributes):
        super().__init__()
        self.contraction = contraction
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        self.register_buffer("attributes", attributes)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        vectors, radial = edge_basis(positions, self.src, self.dst, 2)
        lengths = (vectors * vectors).sum(-1, keepdim=True).sqrt()
        Y = torch.cat([torch.ones_like(lengths), vectors / lengths], dim=-1)
        A = Y.new_zeros(positions.shape[0], 2, 4).index_add(0, self.dst, radial[:, :, None] * Y[:, None])
        B = self.contraction(A, self.attributes)
        return (B * B).sum() + B.sum()


class Products(torch.nn.Module):
    """The CG modules on a density ``A [nodes, channels, 1 + 3]``: one path, a weighted product, a product with
    per-row weights and the CG iteration."""

    def __init__(self, src, dst):
        super().__init__()
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        self.single = CGCalculatorSingle(1, 1, 2, dtype=torch.float64)
        self.product = ClebschGordanProduct(1, 1, weights=True, normalization="component", dtype=torch.float64)
        self.per_row = ClebschGordanProduct(1, 1, lmax_out=1, weights="per_row", dtype=torch.float64)
        self.iteration = ClebschGordanIteration(1, 3, dtype=torch.float64)
        with torch.no_grad():
            self.product.weight.uniform_(0.5, 1.5)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        vectors, radial = edge_basis(positions, self.src, self.dst, 3)
        lengths = (vectors * vectors).sum(-1, keepdim=True).sqrt()
        Y = torch.cat([torch.ones_like(lengths), vectors / lengths], dim=-1)
        A = Y.new_zeros(positions.shape[0], 3, 4).index_add(0, self.dst, radial[:, :, None] * Y[:, None])
        energy = self.single(A[..., 1:], A[..., 1:]).pow(2).sum() + self.product(A, A).sum()
        frequencies = torch.arange(1, self.per_row.n_paths + 1, dtype=A.dtype, device=A.device)
        energy = energy + self.per_row(A, A[:, :1], torch.sin(A[..., :1] * frequencies)).pow(2).sum()
        for X in self.iteration(A):
            energy = energy + X.sum()
        return energy


class Gaussians(torch.nn.Module):
    """Sensitivities of HIP-NN's kind (Gaussians in inverse distance times a cosine cutoff), written so that
    TorchScript compiles them (hippynn's own sensitivity modules do not script)."""

    def __init__(self, n_dist: int, min_dist_soft: float, max_dist_soft: float, hard_max_dist: float):
        super().__init__()
        inverse = torch.linspace(1.0 / max_dist_soft, 1.0 / min_dist_soft, n_dist, dtype=torch.float64)
        self.inverse_mu = torch.nn.Parameter(inverse[None])
        self.sigma = torch.nn.Parameter(torch.full((1, n_dist), 2.0 * min_dist_soft * n_dist, dtype=torch.float64))
        self.hard_max_dist = hard_max_dist

    def forward(self, distances: torch.Tensor) -> torch.Tensor:
        gaussians = torch.exp(-0.5 * ((1.0 / distances[:, None] - self.inverse_mu) * self.sigma) ** 2)
        cutoff = torch.cos(0.5 * torch.pi * distances / self.hard_max_dist) ** 2
        return gaussians * (cutoff * (distances <= self.hard_max_dist).to(distances.dtype))[:, None]


class Hipnn(torch.nn.Module):
    """hippynn's interaction layer (``InteractLayer``, on the kernels active when it is scripted) on the pairs of
    all atoms within the cutoff."""

    def __init__(self, layer, pair_first, pair_second, generator):
        super().__init__()
        self.layer = layer
        self.register_buffer("pair_first", pair_first)
        self.register_buffer("pair_second", pair_second)
        self.features = torch.nn.Parameter(torch.randn(NODES, layer.nf_in, generator=generator, dtype=torch.float64))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        vectors = positions[self.pair_second] - positions[self.pair_first]
        distances = (vectors * vectors).sum(-1).sqrt()
        return torch.tanh(self.layer(self.features, self.pair_first, self.pair_second, distances)).sum()


def _graph(generator):
    src = torch.randint(0, NODES, (EDGES,), generator=generator)
    return src, (src + torch.randint(1, NODES, (EDGES,), generator=generator)) % NODES  # no self-edges


def _positions(generator):
    return 2 * torch.randn(NODES, 3, generator=generator, dtype=torch.float64)


def _o3():
    return pytest.importorskip("e3nn.o3")


def _nequip_product(generator, product=None, **options):
    """e3nn's product (``product``, e.g. ``o3.TensorProduct``) or ours for NequIP's convolution at small size,
    with its spherical harmonics."""
    o3 = _o3()
    from sparse_accumulation.e3nn import TensorProduct

    irreps_in1, irreps_sh = o3.Irreps("4x0e + 4x1o + 4x2e"), o3.Irreps("0e + 1o + 2e")
    irreps_out, instructions = [], []
    for i1, (mul, ir1) in enumerate(irreps_in1):
        for i2, (_, ir2) in enumerate(irreps_sh):
            for ir in ir1 * ir2:
                if ir in o3.Irreps("0e + 1o + 2e"):
                    instructions.append((i1, i2, len(irreps_out), "uvu", True))
                    irreps_out.append((mul, ir))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # e3nn computes its 3j symbols in the default dtype
    try:
        tp = (product or TensorProduct)(irreps_in1, irreps_sh, o3.Irreps(irreps_out), instructions,
                                        shared_weights=False, internal_weights=False, **options)
        sh = o3.SphericalHarmonics(irreps_sh, normalize=True, normalization="component")
    finally:
        torch.set_default_dtype(previous)
    return tp, sh


def tensor_product_model(generator, indexed=False, product=None):
    tp, sh = _nequip_product(generator, product)
    return Forces(Convolution(tp, sh, *_graph(generator), indexed, generator))


def contraction_model(generator, y_kind="one-hot", contraction=None):
    if contraction is None:
        contraction = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 3, num_elements=3, dtype=torch.float64)
        with torch.no_grad():
            for p in contraction.parameters():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
    elements = torch.arange(NODES) % 3
    attributes = elements if y_kind == "indices" else torch.nn.functional.one_hot(elements, 3).to(torch.float64)
    return Forces(Density(contraction, *_graph(generator), attributes))


def products_model(generator):
    return Forces(Products(*_graph(generator)))


def hippynn_model(generator):
    """hippynn's interaction layer on our sums (``sparse_accumulation.hippynn.register``), made active for the
    model's scripting by the ``hippynn_kernels`` fixture."""
    from hippynn.layers.hiplayers.interactions import InteractLayer

    layer = InteractLayer(4, 5, 3, 0.8, 3.0, 6.0, Gaussians).to(torch.float64)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) / 3)
    pairs = torch.cartesian_prod(torch.arange(NODES), torch.arange(NODES))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return Forces(Hipnn(layer, pairs[:, 0].contiguous(), pairs[:, 1].contiguous(), generator))


MODELS = {
    "tensor product": tensor_product_model,
    "message passing": lambda generator: tensor_product_model(generator, indexed=True),
    "symmetric contraction": contraction_model,
    "symmetric contraction, element indices": lambda generator: contraction_model(generator, "indices"),
    "CG products": products_model,
    "hippynn interaction": hippynn_model,
}


@pytest.fixture
def hippynn_kernels():
    """hippynn's interaction sums are ours while the test runs (TorchScript compiles the function that hippynn's
    layer calls, ``hippynn.custom_kernels.envsum``, when it scripts the layer); hippynn's are restored after."""
    custom_kernels = pytest.importorskip("hippynn.custom_kernels")
    sa.hippynn.register()
    previous = custom_kernels.CUSTOM_KERNELS_ACTIVE
    custom_kernels.set_custom_kernels("sparse_accumulation")
    assert custom_kernels.envsum is sa.envsum
    yield
    custom_kernels.set_custom_kernels(previous if isinstance(previous, str) else "pytorch")


def make_model(name, generator, request):
    """The model ``name`` of :data:`MODELS` (hippynn's with our sums active)."""
    if name == "hippynn interaction":
        request.getfixturevalue("hippynn_kernels")
    return MODELS[name](generator)


@pytest.fixture(params=["fused", "per edge"])
def schedule(request, monkeypatch):
    """Message passing on the CPU's numba kernels, fused or per edge (the schedule is fixed when a product is
    made)."""
    from sparse_accumulation.e3nn import tensor_product

    monkeypatch.setattr(tensor_product, "FUSED_MIN_CHANNELS", 0 if request.param == "fused" else 1 << 30)
    return request.param


def assert_same_forces_and_training_gradients(scripted, model, positions, generator):
    """Energies and forces, and the gradients of a force-matching loss with respect to every parameter (the
    double backward of training on forces), of a scripted model equal the eager model's."""
    for create_graph in (False, True):
        energy, forces = scripted(positions, create_graph)
        expected_energy, expected_forces = model(positions, create_graph)
        assert_close(energy, expected_energy, "energy")
        assert_close(forces, expected_forces, "forces")
    target = torch.randn(forces.shape, generator=generator, dtype=torch.float64).to(forces.device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    assert parameters
    grads = []
    for m in (scripted, model):
        energy, forces = m(positions, True)
        loss = energy ** 2 + ((forces - target) ** 2).sum()
        grads.append(torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad]))
    for a, b in zip(*grads):
        assert_close(a, b, "parameter gradient")


@pytest.mark.parametrize("name", list(MODELS))
def test_scripted_models_give_the_eager_energies_forces_and_training_gradients(generator, name, request):
    model = make_model(name, generator, request)
    scripted = torch.jit.script(model)
    assert_same_forces_and_training_gradients(scripted, model, _positions(generator), generator)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(MODELS))
def test_scripted_models_on_cuda(generator, name, request):
    """On CUDA tensors (the Triton kernels, the channel layout of the tensor product)."""
    model = make_model(name, generator, request).cuda()
    scripted = torch.jit.script(model)
    assert_same_forces_and_training_gradients(scripted, model, _positions(generator).cuda(), generator)


def test_message_passing_schedules_script(generator, schedule):
    model = tensor_product_model(generator, indexed=True)
    assert model.energy.tp._per_edge_on_cpu == (schedule == "per edge")
    assert_same_forces_and_training_gradients(torch.jit.script(model), model, _positions(generator), generator)


def test_scripted_tensor_product_model_equals_e3nn(generator):
    o3 = _o3()
    ours = tensor_product_model(generator)
    generator.manual_seed(generator.initial_seed())
    theirs = tensor_product_model(generator, product=o3.TensorProduct)
    generator.manual_seed(generator.initial_seed())
    indexed = tensor_product_model(generator, indexed=True)
    positions = _positions(generator)
    expected_energy, expected_forces = theirs(positions)
    for model in (ours, indexed):
        energy, forces = torch.jit.script(model)(positions)
        assert_close(energy, expected_energy, "energy")
        assert_close(forces, expected_forces, "forces")


def test_scripted_contraction_model_equals_mace(generator):
    from mace_helpers import mace_contraction, mace_module

    mace_module()
    theirs = mace_contraction("2x0e+2x1o", "2x0e+2x1o", 3, 3, generator)
    ours = SymmetricContraction.from_mace(theirs)
    positions = _positions(generator)
    generator.manual_seed(generator.initial_seed())
    expected_energy, expected_forces = contraction_model(generator, contraction=theirs)(positions)
    generator.manual_seed(generator.initial_seed())
    energy, forces = torch.jit.script(contraction_model(generator, contraction=ours))(positions)
    assert_close(energy, expected_energy, "energy", rtol=1e-10)  # MACE's U tensors: ~1e-16 off exact zeros
    assert_close(forces, expected_forces, "forces", rtol=1e-10)


_FRESH_PROCESS = textwrap.dedent("""
    import sys

    import torch

    import sparse_accumulation  # noqa: F401  (registers the ops the scripted models call)

    folder, names = sys.argv[1], sys.argv[2:]
    positions = torch.load(f"{folder}/positions.pt")
    results = {}
    for name in names:
        model = torch.jit.load(f"{folder}/{name}.pt")
        energy, forces = model(positions)
        results[name] = (energy.detach(), forces.detach())
    torch.save(results, f"{folder}/results.pt")
""")


def run_in_fresh_process(folder, names) -> dict:
    """``{name: (energy, forces)}`` of the scripted models ``folder/<name>.pt`` at ``folder/positions.pt``, loaded by
    ``torch.jit.load`` in a new Python process that imports only torch and sparse_accumulation."""
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(folder), *names], env=_environment(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return torch.load(folder / "results.pt")


_FRESH_MACE = textwrap.dedent("""
    import sys

    import torch

    import sparse_accumulation  # noqa: F401  (registers the ops the scripted model calls)

    folder = sys.argv[1]
    model = torch.jit.load(f"{folder}/model.pt")
    out = model(torch.load(f"{folder}/data.pt"))
    torch.save({key: out[key].detach() for key in ("energy", "forces")}, f"{folder}/results.pt")
""")


def _environment() -> dict:
    """The environment of a child process that imports this checkout's sparse_accumulation."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(sa.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
def test_mace_model_with_our_modules_passes_mace_scripting(tmp_path):
    """A whole MACE model with our symmetric contractions and tensor products: MACE's ``jit.compile`` scripts it,
    the scripted model gives MACE's energies, forces and training gradients (``mace_model.py``, in a process of its
    own), and loaded in a fresh process with only torch and sparse_accumulation imported, the same energies and
    forces."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mace_model.py")
    built = subprocess.run([sys.executable, script, str(tmp_path)], env=_environment(), capture_output=True,
                           text=True, timeout=600)
    if built.returncode == 3:
        pytest.skip(built.stderr.strip().splitlines()[-1])
    assert built.returncode == 0, built.stderr
    loaded = subprocess.run([sys.executable, "-c", _FRESH_MACE, str(tmp_path)], env=_environment(),
                            capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr
    results, expected = torch.load(tmp_path / "results.pt"), torch.load(tmp_path / "expected.pt")
    for key in ("energy", "forces"):
        assert_close(results[key], expected[key], key)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_saved_models_load_in_a_fresh_process(generator, tmp_path, request, device):
    positions = _positions(generator).to(device)
    torch.save(positions, tmp_path / "positions.pt")
    expected = {}
    for number, name in enumerate(MODELS):
        if name == "hippynn interaction" and importlib.util.find_spec("hippynn") is None:
            continue
        model = make_model(name, generator, request).to(device)
        torch.jit.save(torch.jit.script(model), tmp_path / f"model{number}.pt")
        expected[f"model{number}"] = (name, model(positions))
    loaded = run_in_fresh_process(tmp_path, list(expected))
    for key, (name, (energy, forces)) in expected.items():
        assert_close(loaded[key][0], energy, f"{name}: energy")
        assert_close(loaded[key][1], forces, f"{name}: forces")


def assert_same_values_and_gradients(scripted, module, inputs, generator, **keywords):
    """A scripted module's output and the gradients of its inputs that require grad and of its parameters, to
    second order (the gradients' own backward), equal the eager module's."""
    outputs, firsts, seconds = [], [], []
    cotangent = None
    for m in (scripted, module):
        leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        leaves += [p for p in m.parameters() if p.requires_grad]
        out = m(*inputs, **keywords)
        outputs.append(out)
        if not out.requires_grad:  # nothing is computed
            continue
        cotangent = torch.randn(out.shape, generator=generator, dtype=out.dtype) if cotangent is None else cotangent
        grads = torch.autograd.grad((out * cotangent).sum(), leaves, create_graph=True, allow_unused=True)
        present = [g for g in grads if g is not None]
        firsts.append(grads)
        seconds.append(torch.autograd.grad(sum(g.pow(2).sum() for g in present), leaves, allow_unused=True)
                       if present and any(g.requires_grad for g in present) else ())
    assert_close(outputs[0], outputs[1], "output")
    assert outputs[0].requires_grad == outputs[1].requires_grad
    for what, pair in (("gradient", firsts), ("second derivative", seconds)):
        if not pair:
            continue
        ours, theirs = pair
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert (a is None) == (b is None), what
            if a is not None:
                assert_close(a, b, what)


def _random(generator, *shape, requires_grad=True):
    return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_(requires_grad)


def _tensor_product(*args, **kwargs):
    from sparse_accumulation.e3nn import TensorProduct

    _o3()
    return TensorProduct(*args, dtype=torch.float64, **kwargs)


def _uvu(irreps_in1, irreps_in2, irreps_out):
    o3 = _o3()
    irreps_in1, irreps_in2, irreps_out = o3.Irreps(irreps_in1), o3.Irreps(irreps_in2), o3.Irreps(irreps_out)
    return [(i1, i2, io, "uvu", True) for i1, (_, ir1) in enumerate(irreps_in1)
            for i2, (_, ir2) in enumerate(irreps_in2)
            for io, (_, ir_out) in enumerate(irreps_out) if ir_out in ir1 * ir2]


NEQUIP = ("4x0e + 4x1o + 4x2e", "0e + 1o + 2e", "4x0e + 4x1o + 4x2e")
# uvu with a column of ones (an unweighted instruction among weighted ones) and weights no instruction reads
# (uvu into a 0x output): the row rule reads some of the weights' columns
MIXED = ("4x0e + 4x1o", "0e + 1o", "4x0e + 4x1o + 0x1e",
         [(0, 0, 0, "uvu", True), (1, 1, 2, "uvu", True), (1, 0, 1, "uvu", True), (1, 1, 0, "uvu", False)])
UUU = ("3x0e + 3x1o + 3x1e", "3x0e + 3x1o + 3x1e", "3x0e + 3x1o + 3x1e",
       [(0, 0, 0, "uuu", True), (1, 1, 0, "uuu", True), (1, 0, 1, "uuu", False), (2, 1, 1, "uuu", True)])


@pytest.mark.parametrize("case", ["per-row weights", "per-row weights, channel layout", "shared weights",
                                  "internal weights", "mixed", "uuu", "unweighted", "broadcast",
                                  "broadcast, channel layout", "nothing computed", "torch kernels"])
def test_tensor_product_configurations_script(generator, case):
    per_row = {"shared_weights": False, "internal_weights": False}
    lead = {"x": (7,), "y": (7,), "w": (7,)}
    if case.startswith("per-row") or case.startswith("broadcast") or case == "torch kernels":
        tp = _tensor_product(*NEQUIP, _uvu(*NEQUIP), channels=4 if "channel layout" in case else None,
                             implementation="torch" if case == "torch kernels" else None, **per_row)
        if case.startswith("broadcast"):
            lead = {"x": (2, 5), "y": (5,), "w": (2, 1)}
    elif case in ("shared weights", "internal weights"):
        tp = _tensor_product(*NEQUIP, _uvu(*NEQUIP), internal_weights=case == "internal weights")
    elif case == "mixed":
        tp = _tensor_product(*MIXED, **per_row)
        assert tp._row_weight_columns is not None and tp._ones_column
    elif case == "uuu":
        tp = _tensor_product(*UUU, **per_row)
    elif case == "unweighted":
        tp = _tensor_product("2x0e + 2x1o", "0e + 1o", "2x0e + 2x1o", [(0, 0, 0, "uvu", False), (1, 1, 0, "uvu", False),
                                                                      (1, 0, 1, "uvu", False)])
    else:
        tp = _tensor_product("2x0e + 0x1o", "0e", "2x0e + 3x1o", [(1, 0, 1, "uvu", True)])
    x, y = _random(generator, *lead["x"], tp.irreps_in1.dim), _random(generator, *lead["y"], tp.irreps_in2.dim)
    weight = None
    if tp.weight_numel and not tp.internal_weights:
        weight = _random(generator, *(() if tp.shared_weights else lead["w"]), tp.weight_numel)
    assert_same_values_and_gradients(torch.jit.script(tp), tp, (x, y, weight), generator)


@pytest.mark.parametrize("form", ["gather x, scatter", "gather y", "no scatter", "shared weights",
                                  "internal weights", "int32 indices"])
def test_message_passing_forms_script(generator, form, schedule):
    weights = {"shared_weights": False, "internal_weights": False}
    if form in ("shared weights", "internal weights"):
        weights = {"internal_weights": form == "internal weights"}
    tp = _tensor_product(*NEQUIP, _uvu(*NEQUIP), **weights)
    nodes, edges = 5, 17
    src, dst = (torch.randint(0, nodes, (edges,), generator=generator) for _ in range(2))
    x = _random(generator, nodes, tp.irreps_in1.dim)
    Y = _random(generator, 3 if form == "gather y" else edges, tp.irreps_in2.dim)
    W = None if tp.internal_weights else _random(generator, *(() if tp.shared_weights else (edges,)), tp.weight_numel)
    keywords = {"indices_1": src, "indices_out": dst, "size_out": nodes}
    if form == "gather y":
        keywords["indices_2"] = torch.randint(0, 3, (edges,), generator=generator)
    elif form == "no scatter":
        keywords = {"indices_1": src}
    elif form == "int32 indices":
        keywords = {"indices_1": src.int(), "indices_out": dst.int(), "size_out": nodes}
    assert_same_values_and_gradients(torch.jit.script(tp), tp, (x, Y, W), generator, **keywords)


@pytest.mark.parametrize("y_kind", ["indices", "int32 indices", "one-hot", "scaled rows", "soft rows",
                                    "requires grad"])
def test_symmetric_contraction_node_attributes_script(generator, y_kind):
    """Every reading of the node attributes (element indices, one-hot rows, scaled rows with zero rows, rows of
    several nonzeros, a y that requires grad) gives the eager values and derivatives."""
    module = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 3, num_elements=3, dtype=torch.float64)
    elements = torch.arange(7) % 3
    one_hot = torch.nn.functional.one_hot(elements, 3).to(torch.float64)
    y = {"indices": elements, "int32 indices": elements.int(), "one-hot": one_hot,
         "scaled rows": one_hot * torch.tensor([[2.0], [0.0], [1.0], [-1.5], [0.0], [3.0], [1.0]], dtype=torch.float64),
         "soft rows": torch.rand(7, 3, generator=generator, dtype=torch.float64),
         "requires grad": one_hot.clone().requires_grad_()}[y_kind]
    x = _random(generator, 7, 2, 4)
    assert_same_values_and_gradients(torch.jit.script(module), module, (x, y), generator)


def test_symmetric_contraction_external_weights_script(generator):
    module = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o+2x2e", [3, 2, 1], num_elements=3, internal_weights=False,
                                  dtype=torch.float64)
    internal = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o+2x2e", [3, 2, 1], num_elements=3, dtype=torch.float64)
    weights = [[_random(generator, *w.shape) for w in c.tensors()] for c in internal.contractions]
    scripted = torch.jit.script(module)
    x, elements = _random(generator, 5, 2, 4), torch.tensor([0, 2, 1, 2, 0])
    assert_close(scripted(x, elements, weights), module(x, elements, weights), "output")
    leaves = [x] + [w for per_irrep in weights for w in per_irrep]
    for a, b in zip(torch.autograd.grad(scripted(x, elements, weights).sum(), leaves),
                    torch.autograd.grad(module(x, elements, weights).sum(), leaves)):
        assert_close(a, b, "gradient")


@pytest.mark.parametrize("weights", [False, True, "per_row"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_products_script(generator, weights, dtype):
    product = ClebschGordanProduct([(2, 1), (1, 2)], 1, weights=weights, dtype=torch.float64)
    X1 = torch.randn(4, 3, product.dim1, generator=generator, dtype=dtype).requires_grad_()
    X2 = torch.randn(4, 1, product.dim2, generator=generator, dtype=dtype).requires_grad_()
    W = _random(generator, 4, 3, product.n_paths) if weights == "per_row" else None
    scripted = torch.jit.script(product)
    if dtype.is_complex:
        assert_close(scripted(X1, X2, W), product(X1, X2, W), "output")
        for a, b in zip(torch.autograd.grad(scripted(X1, X2, W).abs().pow(2).sum(), (X1, X2)),
                        torch.autograd.grad(product(X1, X2, W).abs().pow(2).sum(), (X1, X2))):
            assert_close(a, b, "gradient")
    else:
        assert_same_values_and_gradients(scripted, product, (X1, X2, W), generator)


def test_single_path_and_iteration_script(generator):
    single = CGCalculatorSingle(2, 1, 3, dtype=torch.float64)
    assert_same_values_and_gradients(torch.jit.script(single), single,
                                     (_random(generator, 3, 2, 5), _random(generator, 3, 1, 3)), generator)
    iteration = ClebschGordanIteration(2, 3, lmax_out=2, weights=True, dtype=torch.float64)
    X = _random(generator, 4, 2, 9)
    scripted = torch.jit.script(iteration)
    ours, theirs = scripted(X), iteration(X)
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert_close(a, b, "output")
    for a, b in zip(torch.autograd.grad(sum(t.pow(2).sum() for t in ours), [X, *iteration.parameters()]),
                    torch.autograd.grad(sum(t.pow(2).sum() for t in theirs), [X, *iteration.parameters()])):
        assert_close(a, b, "gradient")


def test_e3nn_jit_compile_scripts_our_modules(generator):
    """e3nn's ``jit.compile`` (MACE's scripting) scripts our modules as it does e3nn's and MACE's own."""
    jit = pytest.importorskip("e3nn.util.jit")
    tp = _tensor_product(*NEQUIP, _uvu(*NEQUIP), shared_weights=False, internal_weights=False)
    contraction = SymmetricContraction("2x0e+2x1o", "2x0e+2x1o", 3, num_elements=3, dtype=torch.float64)
    x, y, w = _random(generator, 5, tp.irreps_in1.dim), _random(generator, 5, 9), _random(generator, 5, tp.weight_numel)
    features, elements = _random(generator, 5, 2, 4), torch.tensor([0, 1, 2, 1, 0])
    for module, inputs in ((tp, (x, y, w)), (contraction, (features, elements))):
        compiled = jit.compile(module, in_place=False)
        assert isinstance(compiled, torch.jit.ScriptModule)
        assert_close(compiled(*inputs), module(*inputs), type(module).__name__)


def test_scripted_calls_check_their_inputs(generator):
    """What the registered ops trust (widths, dtypes, required weights) is checked by the scripted modules, with
    the eager modules' messages (TorchScript raises them as ``torch.jit.Error``)."""
    tp = torch.jit.script(_tensor_product(*NEQUIP, _uvu(*NEQUIP), shared_weights=False, internal_weights=False))
    x, y, w = _random(generator, 5, 36), _random(generator, 5, 9), _random(generator, 5, 44)
    with pytest.raises(torch.jit.Error, match="weight is required: this TensorProduct has no internal weights"):
        tp(x, y)
    with pytest.raises(torch.jit.Error, match=r"weight must be \[\.\.\., 44\]"):
        tp(x, y, w[:, :40])
    with pytest.raises(torch.jit.Error, match="y has dtype torch.float32 but x has dtype torch.float64"):
        tp(x, y.float(), w)
    with pytest.raises(torch.jit.Error, match="size_out is required with indices_out"):
        tp(x, y, w, indices_1=torch.zeros(5, dtype=torch.int64), indices_out=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(torch.jit.Error, match="indices_1 must have an integer dtype"):
        tp(x, y, w, indices_1=torch.zeros(5))
    product = torch.jit.script(ClebschGordanProduct(1, 1, weights="per_row", dtype=torch.float64))
    with pytest.raises(torch.jit.Error, match=r"W must be \[\.\.\., channels, 6\]"):
        product(_random(generator, 3, 2, 4), _random(generator, 3, 2, 4), _random(generator, 3, 2, 4))
    single = torch.jit.script(CGCalculatorSingle(1, 1, 0, dtype=torch.float64))
    with pytest.raises(torch.jit.Error, match="X1 has dtype torch.float32 but the coefficients C has dtype"):
        single(torch.randn(2, 3), torch.randn(2, 3))
    contraction = torch.jit.script(SymmetricContraction("2x0e+2x1o", "2x0e", 2, num_elements=2,
                                                        internal_weights=False, dtype=torch.float64))
    with pytest.raises(torch.jit.Error, match=r"the weights must be \[num_elements=2, paths, channels=2\]"):
        contraction(_random(generator, 3, 2, 4), torch.tensor([0, 1, 1]), [[_random(generator, 2, 1, 3),
                                                                           _random(generator, 2, 1, 3)]])


def _pair_sums(sensitivities: torch.Tensor, features: torch.Tensor, pair_first: torch.Tensor,
               pair_second: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    env = sa.envsum(sensitivities, features, pair_first, pair_second)
    return (env, sa.sensesum(env, features, pair_first, pair_second),
            sa.featsum(env, sensitivities, pair_first, pair_second, "torch"))


def test_pair_sums_script(generator):
    """The pair sums called from TorchScript: the eager values and derivatives, their inputs checked."""
    scripted = torch.jit.script(_pair_sums)
    pair_first, pair_second = torch.randint(0, 5, (2, 11), generator=generator)
    inputs = [_random(generator, 11, 3), _random(generator, 5, 4)]
    ours, theirs = scripted(*inputs, pair_first, pair_second), _pair_sums(*inputs, pair_first, pair_second)
    for a, b in zip(ours, theirs):
        assert_close(a, b, "sum")
    total = [sum(t.pow(2).sum() for t in outputs) for outputs in (ours, theirs)]
    for a, b in zip(torch.autograd.grad(total[0], inputs), torch.autograd.grad(total[1], inputs)):
        assert_close(a, b, "gradient")
    with pytest.raises(torch.jit.Error, match="pair_second has 10 pairs but sensitivities has 11"):
        scripted(*inputs, pair_first, pair_second[:10])
    with pytest.raises(torch.jit.Error, match="features has dtype torch.float32 but sensitivities has dtype"):
        scripted(inputs[0], inputs[1].float(), pair_first, pair_second)
    with pytest.raises(RuntimeError, match=r"IndexError: pair_first must hold atom indices in \[0, 5\)"):
        scripted(*inputs, pair_first + 5, pair_second)  # checked by the op (an error from inside the op)
