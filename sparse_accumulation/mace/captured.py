"""A MACE model's forces call replayed from CUDA graphs, for molecular dynamics.

MD calls the same model millions of times on one system whose positions, and now and then neighbour list, change.
:class:`CapturedModel` wraps a model with MACE's call (``model(data, compute_force=..., compute_stress=...)``,
e.g. one converted by :func:`~sparse_accumulation.mace.accelerate`) and, on CUDA, captures that call once per
size bucket in a CUDA graph, then replays it: each call copies the batch into the bucket's static inputs,
replays the graph and returns copies of the outputs. Engines that call MACE's models (MACE's ASE calculator, a
plain loop; MACE's torch-sim model builds the same batch) take the wrapper in place of the model, unchanged.

Buckets: atoms and edges are padded up to a bucket's sizes with a padding system that contributes nothing to the
real ones: one extra graph holds every padding atom (zero node attributes, at the origin, in a cubic cell larger
than the cutoff) and every padding edge (from a padding atom to its own image one cell away, so beyond the
cutoff; spread over the padding atoms); its energy, forces and stress are dropped. A call that fits an existing
bucket replays its graph; a system that outgrows every bucket is captured again, in a new bucket sized with
headroom (see :class:`CapturedModel`). Graphs share one memory pool.

With ``compile=True`` the captured call is the model compiled by ``torch.compile`` (one graph per bucket: the
shapes are static): inductor fuses what surrounds the equivariant kernels (radial bases, envelopes, the radial
networks' activations, spherical harmonics, readouts, and their derivatives) into fewer kernels, so a replay
launches fewer of them. The first call of each bucket compiles (minutes for a MACE model, then cached on disk by
inductor); the positions are made to require grad and, for stress and virials, the strain (``displacement``) is a
static input leaf, as a compiled MACE call needs (see ``docs/mace.rst``).

With ``hoist_elements=True`` (the default) what the converted layers make of the node attributes (the elements, the
nodes sorted by element, the tile tables) is made once, by the eager warm-up calls, and read by the graph, instead
of being rebuilt in every replay: the node attributes rarely change in MD. A call whose node attributes differ from
the bucket's (a host check where the same unchanged tensor comes again, else a comparison on the device, one
synchronisation) rewrites those tables in place before the replay, or captures the bucket again where their kind
changed. On an H200 this took 0.1-0.2 ms off each replayed forces call of the model in ``benchmarks/RESULTS.md``
(64-4,096 atoms).

Calls that a graph cannot replay run the model eagerly: tensors on the CPU (unless ``cpu="padded"``, which runs
the padded buckets eagerly, to test them), ``training=True`` (a training step keeps its autograd graph past
the call), ``compute_hessian=True`` and ``lammps_mliap=True``.
"""
from __future__ import annotations

import contextlib
import math
import weakref
from collections import OrderedDict
from typing import Dict, Optional

import torch

from . import attributes

#: the batch's per-atom, per-edge and per-system entries copied into a bucket (others are not passed on)
ATOM_KEYS = ("positions", "node_attrs", "batch")
EDGE_KEYS = ("edge_index", "shifts", "unit_shifts")
SYSTEM_KEYS = ("cell", "head", "total_charge", "total_spin")
#: outputs per system, per atom and per edge (sliced to the real ones); others are returned as they are
SYSTEM_OUTPUTS = frozenset(("energy", "interaction_energy", "virials", "stress", "displacement", "dipole",
                            "polarizability", "total_charge"))
ATOM_OUTPUTS = frozenset(("forces", "node_energy", "node_feats", "atomic_virials", "atomic_stresses", "charges"))
EDGE_OUTPUTS = frozenset(("edge_forces",))
#: MACE's call options that pick what a graph computes (part of a bucket's key)
CAPTURED_OPTIONS = ("compute_force", "compute_virials", "compute_stress", "compute_displacement",
                    "compute_edge_forces", "compute_atomic_stresses")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _Bucket:
    """Static inputs of ``atoms`` atoms, ``edges`` edges and ``systems`` real systems (plus the padding one),
    the graph captured on them (None where they run eagerly) and its outputs."""

    def __init__(self, data: Dict[str, torch.Tensor], atoms: int, edges: int, systems: int, padding_length: float,
                 leaves: bool = False):
        self.atoms, self.edges, self.systems = atoms, edges, systems
        self.filled = None  # (real atoms, real edges) the padding was last written for
        self.graph, self.outputs = None, None
        self.hoisted = []  # the node attributes' readings the graph reads (see attributes.hoisted)
        self.attributes_from = None  # (weak reference, version) of the node attributes last copied in
        self.padding_length = padding_length
        self.static = {}
        for key in ATOM_KEYS + EDGE_KEYS + SYSTEM_KEYS:
            value = data.get(key)
            if not isinstance(value, torch.Tensor):
                continue
            if key == "cell":
                value = value.reshape(-1, 3)
            if key == "edge_index":
                shape = (2, edges)
            else:
                rows = atoms if key in ATOM_KEYS else edges if key in EDGE_KEYS else (
                    3 * (systems + 1) if key == "cell" else systems + 1)
                shape = (rows,) + tuple(value.shape[1:])
            self.static[key] = torch.zeros(shape, dtype=value.dtype, device=value.device)
        self.cell_rank = data["cell"].dim() if isinstance(data.get("cell"), torch.Tensor) else None
        self.static["ptr"] = torch.zeros(systems + 2, dtype=data["ptr"].dtype, device=data["ptr"].device)
        if leaves:  # what a compiled call differentiates must be its inputs: the positions, and the strain
            positions = self.static["positions"].requires_grad_(True)
            self.static["displacement"] = torch.zeros((systems + 1, 3, 3), dtype=positions.dtype,
                                                      device=positions.device, requires_grad=True)

    def attributes_changed(self, data: Dict[str, torch.Tensor], atoms: int) -> bool:
        """Whether copying ``data`` in would change the static node attributes (before :meth:`fill`): not where
        the same tensor comes again unchanged; else compared on the device (one synchronisation)."""
        y, static = data.get("node_attrs"), self.static.get("node_attrs")
        if not isinstance(y, torch.Tensor) or static is None:
            return False
        if self.filled is None or self.filled[0] != atoms:  # the padding atoms' rows are written again
            return True
        last = self.attributes_from
        if last is not None and last[0]() is y and last[1] == y._version:
            return False
        return not torch.equal(static[:atoms], y)

    def fill(self, data: Dict[str, torch.Tensor], atoms: int, edges: int) -> None:
        """Copy the batch into the static inputs and, where the real sizes changed, rewrite the padding."""
        static, G = self.static, self.systems
        if isinstance(data.get("node_attrs"), torch.Tensor):
            self.attributes_from = (weakref.ref(data["node_attrs"]), data["node_attrs"]._version)
        with torch.no_grad():
            for key in ATOM_KEYS:
                if key in static:
                    static[key][:atoms].copy_(data[key])
            for key in EDGE_KEYS:
                if key in static:
                    if key == "edge_index":
                        static[key][:, :edges].copy_(data[key])
                    else:
                        static[key][:edges].copy_(data[key])
            for key in SYSTEM_KEYS:
                if key in static:
                    value = data[key].reshape(-1, 3) if key == "cell" else data[key]
                    static[key][:value.shape[0]].copy_(value)
            static["ptr"][:G + 1].copy_(data["ptr"])
            if self.filled != (atoms, edges):
                self._pad(atoms, edges)
                self.filled = (atoms, edges)

    def _pad(self, atoms: int, edges: int) -> None:
        static, G, length = self.static, self.systems, self.padding_length
        for key in ATOM_KEYS:
            if key in static:
                static[key][atoms:].fill_(G if key == "batch" else 0)
        if "edge_index" in static:
            # each padding edge from a padding atom to its own image, spread over the padding atoms as evenly as
            # real edges over real atoms (the kernels that sum over a node's edges would wait for one long list)
            spread = torch.arange(self.edges - edges, device=static["edge_index"].device) % (self.atoms - atoms)
            static["edge_index"][:, edges:] = atoms + spread
        for key, scale in (("shifts", length), ("unit_shifts", 1.0)):
            if key in static:
                static[key][edges:].zero_()
                static[key][edges:, 0] = scale
        if "cell" in static:
            static["cell"][3 * G:] = length * torch.eye(3, dtype=static["cell"].dtype, device=static["cell"].device)
        for key in ("head", "total_charge", "total_spin"):
            if key in static:
                static[key][G:] = 0
        static["ptr"][G + 1] = self.atoms

    def inputs(self) -> Dict[str, torch.Tensor]:
        """The static inputs as the model takes them (a new dict: MACE's call replaces some of its entries)."""
        data = dict(self.static)
        if "cell" in data and self.cell_rank == 3:
            data["cell"] = data["cell"].view(-1, 3, 3)
        return data

    def real_outputs(self, out: dict, atoms: int, edges: int, copy: bool) -> dict:
        """The outputs of the real systems, atoms and edges (copies where ``copy``: a replay overwrites them)."""
        result = {}
        for key, value in out.items():
            if isinstance(value, torch.Tensor):
                if key in SYSTEM_OUTPUTS or (value.dim() and value.shape[0] == self.systems + 1):
                    value = value[:self.systems]
                elif key in ATOM_OUTPUTS or (value.dim() and value.shape[0] == self.atoms):
                    value = value[:atoms]
                elif key in EDGE_OUTPUTS:
                    value = value[:edges]
                value = value.detach()
                if copy:
                    value = value.clone()
            result[key] = value
        return result


class CapturedModel(torch.nn.Module):
    """``model`` (MACE's call: ``model(data, training=False, compute_force=True, compute_stress=False, ...)``)
    with its calls on CUDA replayed from CUDA graphs captured once per size bucket (see the module docstring).

    Args:
        model: a MACE energy model (``mace.modules.MACE``, ``ScaleShiftMACE``), typically converted by
            :func:`~sparse_accumulation.mace.accelerate`; it is kept as ``self.model`` and its attributes
            (``r_max``, ``atomic_numbers``, ``heads`` ...) are read through the wrapper.
        atom_multiple: a new bucket's atoms are the real atoms plus padding atoms enough to hold the padding
            edges at the real atoms' mean degree (one at least), rounded up to this multiple.
        edge_headroom: a new bucket's edges are the real edges times ``1 + edge_headroom``, rounded up to
            ``edge_multiple`` (an MD neighbour list grows and shrinks by a few percent).
        edge_multiple: see ``edge_headroom``.
        max_buckets: the most buckets kept; the least recently used one goes first.
        cpu: ``"eager"`` (default): calls on the CPU run the model as it is; ``"padded"``: through the padded
            buckets, without graphs (what a replay computes, on the CPU).
        compile: capture (or, on the CPU with ``cpu="padded"``, run) the model compiled by ``torch.compile``
            (``dynamic=False``: one compiled graph per bucket; torch.compile's limit on recompiles, 8 by default,
            bounds the buckets that compile, later ones run its eager fallback); default False.
        hoist_elements: the graph reads the converted layers' element tables made by the warm-up calls instead
            of rebuilding them in each replay (see the module docstring); default True.

    A call takes MACE's ``data`` dict (a batch of ``ptr``/``batch``-indexed systems): ``positions``,
    ``node_attrs``, ``batch``, ``ptr``, ``edge_index``, ``shifts``, ``unit_shifts``, ``cell`` and, where
    present, ``head``, ``total_charge``, ``total_spin`` (one per system); other entries (``pbc``, the labels of
    a training batch) are not passed on. Outputs are
    MACE's, detached, for the real systems, atoms and edges only (copies: a later call does not change them).

    Parameters changed in place (``load_state_dict``, an optimiser step) are seen by the replays; after
    ``.to()``, ``.float()``, ``.double()`` or :meth:`reset` the buckets are captured again.

    Raises:
        ValueError: bad options; a batch without ``positions``, ``ptr``, ``edge_index`` or ``cell``.
    """

    def __init__(self, model: torch.nn.Module, *, atom_multiple: int = 64, edge_headroom: float = 0.1,
                 edge_multiple: int = 256, max_buckets: int = 8, cpu: str = "eager", compile: bool = False,
                 hoist_elements: bool = True):
        super().__init__()
        for name, value in (("atom_multiple", atom_multiple), ("edge_multiple", edge_multiple),
                            ("max_buckets", max_buckets)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(edge_headroom, (int, float)) or not 0 <= edge_headroom <= 10:
            raise ValueError(f"edge_headroom must be a number in [0, 10], got {edge_headroom!r}")
        if cpu not in ("eager", "padded"):
            raise ValueError(f"cpu must be 'eager' or 'padded', got {cpu!r}")
        for name, value in (("compile", compile), ("hoist_elements", hoist_elements)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        if not hasattr(model, "r_max"):
            raise ValueError(f"model must be a MACE model (with r_max), got {type(model).__name__}")
        self.model = model
        self.atom_multiple, self.edge_headroom, self.edge_multiple = atom_multiple, float(edge_headroom), edge_multiple
        self.max_buckets, self.cpu, self.use_compile = max_buckets, cpu, compile
        self.hoist_elements = hoist_elements
        self.__dict__["_compiled"] = None  # torch.compile of the model, made on first use (not a submodule)
        self._buckets: "OrderedDict[tuple, _Bucket]" = OrderedDict()
        self._pool = None
        #: how many buckets were made (captured, on CUDA) since construction
        self.captures = 0

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None:
                raise
            return getattr(model, name)

    def reset(self) -> None:
        """Forget every bucket and graph (the next calls capture again)."""
        self._buckets.clear()
        self._pool = None
        self.__dict__["_compiled"] = None

    def _apply(self, fn, *args, **kwargs):
        self.reset()  # the graphs read the parameters where they were
        return super()._apply(fn, *args, **kwargs)

    def __getstate__(self):
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__)
        # graphs and compiled code are not saved (nor copied): made again on use
        state.update(_buckets=OrderedDict(), _pool=None, _compiled=None)
        return state

    @property
    def buckets(self) -> list:
        """``(atoms, edges, systems)`` of every bucket kept, least recently used first."""
        return [(b.atoms, b.edges, b.systems) for b in self._buckets.values()]

    def forward(self, data: Dict[str, torch.Tensor], training: bool = False, compute_force: bool = True,
                compute_virials: bool = False, compute_stress: bool = False, compute_displacement: bool = False,
                compute_hessian: bool = False, compute_edge_forces: bool = False,
                compute_atomic_stresses: bool = False, lammps_mliap: bool = False) -> Dict[str, Optional[torch.Tensor]]:
        options = dict(compute_force=compute_force, compute_virials=compute_virials, compute_stress=compute_stress,
                       compute_displacement=compute_displacement, compute_edge_forces=compute_edge_forces,
                       compute_atomic_stresses=compute_atomic_stresses)
        positions = data.get("positions")
        eager = (training or compute_hessian or lammps_mliap or not isinstance(positions, torch.Tensor)
                 or (positions.device.type != "cuda" and self.cpu == "eager"))
        if eager:
            return self.model(data, training=training, compute_hessian=compute_hessian, lammps_mliap=lammps_mliap,
                              **options)
        for key in ("ptr", "edge_index", "cell"):
            if not isinstance(data.get(key), torch.Tensor):
                raise ValueError(f"data must hold the tensor {key!r} (MACE's batch), got "
                                 f"{type(data.get(key)).__name__}")
        atoms, edges, systems = positions.shape[0], data["edge_index"].shape[1], data["ptr"].shape[0] - 1
        bucket = self._bucket(data, atoms, edges, systems, tuple(options.values()))
        stale = bool(bucket.hoisted) and bucket.attributes_changed(data, atoms)
        bucket.fill(data, atoms, edges)
        if stale and not attributes.refresh(bucket.hoisted):
            bucket.graph, bucket.hoisted = None, []  # the readings changed kind: captured again below
        if bucket.graph is None and positions.device.type == "cuda":
            self._capture(bucket, options)
        if bucket.graph is None:
            return bucket.real_outputs(self._runner()(bucket.inputs(), **options), atoms, edges, copy=False)
        bucket.graph.replay()
        return bucket.real_outputs(bucket.outputs, atoms, edges, copy=True)

    def _bucket(self, data, atoms: int, edges: int, systems: int, options: tuple) -> _Bucket:
        positions = data["positions"]
        kind = (systems, positions.dtype, positions.device, options, tuple(k for k in SYSTEM_KEYS if k in data),
                data["cell"].dim())
        fitting = [(b.atoms, b.edges, key) for key, b in self._buckets.items()
                   if key[0] == kind and b.atoms > atoms and b.edges >= edges
                   and b.atoms <= 2 * atoms + self.atom_multiple and b.edges <= 2 * edges + self.edge_multiple]
        if fitting:
            key = min(fitting)[2]
            self._buckets.move_to_end(key)
            return self._buckets[key]
        padded_edges = _round_up(max(1, math.ceil(edges * (1 + self.edge_headroom))), self.edge_multiple)
        degree = max(1.0, edges / max(atoms, 1))  # padding atoms get as many edges as real ones, on average
        size = (_round_up(atoms + max(1, math.ceil((padded_edges - edges) / degree)), self.atom_multiple),
                padded_edges)
        while len(self._buckets) >= self.max_buckets:
            self._buckets.popitem(last=False)
        bucket = _Bucket(data, size[0], size[1], systems, 2.0 * float(self.model.r_max) + 1.0,
                         leaves=self.use_compile)
        self._buckets[(kind, size)] = bucket
        self.captures += 1
        return bucket

    def _capture(self, bucket: _Bucket, options: dict) -> None:
        """Warm the model up on the bucket's inputs on a side stream (as torch asks), then capture one call."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        run = self._runner()
        with torch.cuda.stream(side):
            for _ in range(2):
                run(bucket.inputs(), **options)
        torch.cuda.current_stream().wait_stream(side)
        graph, hoisted = torch.cuda.CUDAGraph(), []
        with attributes.hoisted(hoisted) if self.hoist_elements else contextlib.nullcontext():
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = run(bucket.inputs(), **options)
        bucket.hoisted = hoisted
        # detached (the same memory, which replays write): the captured energy's autograd graph would otherwise
        # live as long as the bucket, and with it the parameters' gradient accumulators, tied to this capture's
        # stream, which a later capture that trains the model (a backward into the parameters) would meet
        bucket.graph = graph
        bucket.outputs = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}

    def _runner(self):
        """What a bucket's call runs: the model, or with ``compile`` the model compiled (made once)."""
        if not self.use_compile:
            return self.model
        if self.__dict__["_compiled"] is None:
            self.__dict__["_compiled"] = torch.compile(self.model, dynamic=False)
        return self._run_compiled

    def _run_compiled(self, *args, **kwargs):
        # Outside training MACE takes the forces' gradient with retain_graph=False; traced into the compiled graph
        # (dynamo's trace_autograd_ops, which MACE's compile helpers switch on for the whole process) the graph's
        # own backward meets the saved tensors that gradient freed, and compiling fails. A graph break there.
        config = torch._dynamo.config
        patched = (config.patch(trace_autograd_ops=False) if hasattr(config, "trace_autograd_ops")
                   else contextlib.nullcontext())
        with patched:
            return self.__dict__["_compiled"](*args, **kwargs)
