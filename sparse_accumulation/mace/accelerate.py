"""MACE models on this library's kernels: :func:`accelerate` converts a model MACE built or loaded, in place.

Eight kinds of layer change, and nothing else:

* each interaction block's convolution ``conv_tp`` (e3nn's ``TensorProduct``, mode ``"uvu"``, per-edge weights
  from the radial network) becomes a :class:`Convolution`: the gather of the senders' features, the per-edge
  weighted product with the edges' spherical harmonics and the sum over each receiver's edges in one call of
  :class:`sparse_accumulation.e3nn.TensorProduct` (message passing, no per-edge message tensor where the
  kernels fuse it). The block reaches it through MACE's own hook for fused convolutions: a block with a
  ``conv_fusion`` attribute calls ``conv_tp(node_feats, edge_attrs, tp_weights, edge_index)`` in place of
  ``conv_tp(node_feats[sender], ...)`` followed by ``scatter_sum``;
* each product block's ``symmetric_contractions`` becomes :class:`~.symmetric_contraction.SymmetricContraction`
  (:meth:`~.symmetric_contraction.SymmetricContraction.from_mace`);
* each interaction block's skip connection ``skip_tp`` (e3nn's ``FullyConnectedTensorProduct`` of the node
  features with the one-hot node attributes) becomes :class:`~.element_linear.ElementLinear`: one matrix product
  per element instead of a product with every element's weights;
* every e3nn ``o3.Linear`` of the model (embedding, the blocks' linear layers, readouts) becomes
  :class:`sparse_accumulation.e3nn.Linear`, whose backward does not write a gradient the size of the whole input
  for each of its irreps;
* every e3nn ``nn.FullyConnectedNet`` (the radial networks) becomes :class:`sparse_accumulation.e3nn.FullyConnectedNet`,
  the same function with its normalisation constants folded into its weights. A convolution's radial network
  (whose last layer is linear) leaves its computation to the convolution
  (:class:`~sparse_accumulation.e3nn.DeferredWeights`), which computes the per-edge weights whole for most systems
  and chunk by chunk for very large ones;
* the edges' spherical harmonics (e3nn's ``o3.SphericalHarmonics``) become
  :class:`sparse_accumulation.e3nn.SphericalHarmonics`: one matrix product of the edge vectors' tensor powers
  instead of e3nn's polynomials term by term (about 26 operations forward and backward for ``max_ell = 3``, where
  e3nn's take about 170, each a kernel launch on a GPU);
* the radial embedding (MACE's ``RadialEmbeddingBlock`` with a Bessel basis, a polynomial cutoff and no distance
  transform) becomes a :class:`~.radial.RadialEmbedding`: the same function in about 40 operations forward and
  backward instead of 80;
* each converted interaction block's ``reshape`` (MACE's ``reshape_irreps`` of the message to ``[N, mul, dim]``)
  becomes a :class:`~.reshape.ReshapeIrreps`: one column permutation, whose gradient is one gather too.

A converted MACE model also checks its batch's ``edge_index`` first thing (``prepare_edges_first``, a forward
pre-hook), so that the convolutions' reading of the indices does not stop the host in the middle of the step.
A call captured into a CUDA graph runs in a :func:`~sparse_accumulation.indices.capture_scope` (opened by that
hook, closed by a forward hook): its layers sort the edges and the elements once for the whole graph.

All keep MACE's state dict, key for key (the tensors they do not compute with are held as they are), so MACE's
checkpoints load into a converted model and its state loads back into MACE with ``strict=True``.

mace-torch is imported when :func:`accelerate` runs, never when this module is imported.
"""
from __future__ import annotations

import copy
import functools
import importlib
import threading
from collections import OrderedDict
from typing import Optional

import torch

from ..e3nn.fully_connected import DeferredWeights, FullyConnectedNet
from ..e3nn.spherical_harmonics import MAX_L as HARMONICS_MAX_L, SphericalHarmonics
from ..e3nn.tensor_product import TensorProduct
from .. import indices
from ..indices import prepared_index, rememberable
from ..ops.dispatch import saving_only
from .element_linear import ElementLinear
from .radial import RadialEmbedding
from .reshape import ReshapeIrreps
from .symmetric_contraction import SymmetricContraction

__all__ = ["accelerate", "Convolution", "INTERACTION_BLOCKS", "prepare_edges_first"]

#: MACE's interaction block classes (``mace.modules.blocks``) whose convolution :func:`accelerate` replaces:
#: every one mace-torch 0.3.16 ships; their ``forward`` takes the fused path when the block has ``conv_fusion``
INTERACTION_BLOCKS = (
    "RealAgnosticInteractionBlock",
    "RealAgnosticResidualInteractionBlock",
    "RealAgnosticDensityInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
    "RealAgnosticAttResidualInteractionBlock",
    "RealAgnosticResidualNonLinearInteractionBlock",
)

#: model options whose layers run on other libraries' kernels: (attribute of MACE's blocks, what it turns on)
_REFUSED_OPTIONS = (("cueq_config", "cuEquivariance"), ("oeq_config", "OpenEquivariance"))


class Convolution(torch.nn.Module):
    """MACE's interaction convolution and the sum of the messages at their receivers, as one fused call.

    Made from a block's ``conv_tp`` (e3nn's ``o3.TensorProduct`` with per-edge weights, instructions in mode
    ``"uvu"`` or ``"uuu"``): the same instructions and path weights on
    :class:`sparse_accumulation.e3nn.TensorProduct` (attribute ``tensor_product``). Called as MACE's interaction
    blocks call a fused convolution. The tensors of ``conv_tp``'s state (its empty ``weight``, ``output_mask``, the
    Wigner 3j buffers of e3nn's generated code) are held under their names, unused, so that the state dict is
    ``conv_tp``'s; a state whose values of them differ fails to load (MACE would compute with those values).

    Args:
        conv_tp: the block's e3nn ``TensorProduct``.
        implementation: the kernels (None: the library default, numba on the CPU, Triton on CUDA).

    Raises:
        ImportError: e3nn is not installed.
        TypeError: ``conv_tp`` is not e3nn's ``TensorProduct``.
        ValueError: ``conv_tp`` has shared or internal weights (MACE's convolutions have neither).
        NotImplementedError: an instruction in a mode other than ``"uvu"`` and ``"uuu"``.
    """

    def __init__(self, conv_tp: torch.nn.Module, *, implementation: Optional[str] = None):
        super().__init__()
        from e3nn import o3

        if not isinstance(conv_tp, o3.TensorProduct):
            raise TypeError(f"conv_tp must be e3nn's o3.TensorProduct, got {type(conv_tp).__module__}."
                            f"{type(conv_tp).__qualname__}")
        if conv_tp.shared_weights or conv_tp.internal_weights:
            raise ValueError("conv_tp must take per-edge weights (shared_weights=False, internal_weights=False), as "
                             "MACE's interaction blocks build it")
        state = conv_tp.state_dict()
        # e3nn's path_weight is sqrt(alpha); with both normalisations "none" the product scales by sqrt(path_weight)
        instructions = [(ins.i_in1, ins.i_in2, ins.i_out, ins.connection_mode, ins.has_weight, ins.path_weight ** 2)
                        for ins in conv_tp.instructions]
        reference = state["output_mask"]
        self.tensor_product = TensorProduct(
            conv_tp.irreps_in1, conv_tp.irreps_in2, conv_tp.irreps_out, instructions, irrep_normalization="none",
            path_normalization="none", shared_weights=False, internal_weights=False, dtype=reference.dtype,
            implementation=implementation).to(reference.device)
        # the product's own e3nn state (an empty weight, output_mask) repeats conv_tp's, which this module holds
        # under conv_tp's names below: kept out of the state dict
        for name in ("weight", "output_mask"):
            if name in self.tensor_product._buffers:
                self.tensor_product.register_buffer(name, self.tensor_product._buffers.pop(name), persistent=False)
        self._held = tuple(state)
        for name, tensor in state.items():
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, torch.nn.Module())
                owner = getattr(owner, part)
            owner.register_buffer(leaf, tensor.detach().clone())

    #: per-edge weights that come deferred (:class:`~sparse_accumulation.e3nn.DeferredWeights`, from a radial
    #: network whose last layer is linear) are computed whole where they take at most this many bytes, else in
    #: chunks of edges of about this size, each recomputed in the backward instead of kept
    chunk_bytes = 2**31

    @property
    def weight_numel(self) -> int:
        """The number of weights per edge (``tp_weights [edges, weight_numel]``)."""
        return self.tensor_product.weight_numel

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor, tp_weights: torch.Tensor,
                edge_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``out[i] = sum over edges e with edge_index[1, e] == i of conv_tp(node_feats[edge_index[0, e]],
        edge_attrs[e], tp_weights[e])``.

        Args:
            node_feats: ``[nodes, irreps_in1.dim]``.
            edge_attrs: ``[edges, irreps_in2.dim]`` (the edges' spherical harmonics).
            tp_weights: ``[edges, weight_numel]``, of ``node_feats``' dtype, or
                :class:`~sparse_accumulation.e3nn.DeferredWeights` of that shape: the radial network is then
                computed here, whole below :attr:`chunk_bytes`, else for chunks of edges one at a time
                (``torch.utils.checkpoint``: the backward computes each chunk's weights again), so that the
                per-edge weights, their gradient and the network's hidden rows are never held for every edge.
            edge_index: ``[2, edges]`` integer tensor, senders then receivers.

        Returns:
            ``[nodes, irreps_out.dim]`` of ``node_feats``' dtype.

        Raises:
            TypeError: no ``edge_index`` (a block that does not call MACE's fused convolution), dtypes that differ.
            ValueError, IndexError: shapes that do not fit, indices out of range (see
                :meth:`sparse_accumulation.e3nn.TensorProduct.forward`).
        """
        if edge_index is None:
            raise TypeError("Convolution needs edge_index: it replaces conv_tp of MACE blocks that call it as a fused "
                            "convolution, conv_tp(node_feats, edge_attrs, tp_weights, edge_index)")
        if not torch.jit.is_scripting():  # (a scripted model's radial networks return tensors)
            if isinstance(tp_weights, DeferredWeights):
                edges, width = tp_weights.shape
                step = max(1, self.chunk_bytes // max(1, width * tp_weights.features.element_size()))
                if edges > step:
                    return self._in_chunks(node_feats, edge_attrs, tp_weights, edge_index, step)
                tp_weights = tp_weights.materialize()
        return self._messages(node_feats, edge_attrs, tp_weights, edge_index)

    def _messages(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor, tp_weights: torch.Tensor,
                  edge_index: torch.Tensor) -> torch.Tensor:
        return self.tensor_product(node_feats, edge_attrs, tp_weights, indices_1=edge_index[0],
                                   indices_out=edge_index[1], size_out=node_feats.shape[0])

    def _deferred_messages(self, node_feats, edge_attrs, features, matrix, scale, edge_index, hidden_of):
        weights = DeferredWeights(features, matrix, scale, hidden_of).materialize()
        return self._messages(node_feats, edge_attrs, weights, edge_index)

    def _in_chunks(self, node_feats, edge_attrs, weights: DeferredWeights, edge_index, step: int):
        """The sum over chunks of ``step`` edges of their messages, each chunk's weights (the radial network's
        hidden layers too) computed from its rows of ``weights``, used and dropped (checkpointed: recomputed in the
        backward, where the messages themselves are not computed again, see :class:`_ChunkMessages`)."""
        from torch.utils.checkpoint import checkpoint

        out = None
        for start in range(0, edge_attrs.shape[0], step):
            end = min(start + step, edge_attrs.shape[0])
            part = weights.rows(start, end)
            message = checkpoint(_ChunkMessages(self), node_feats, edge_attrs[start:end], part.features,
                                 part.matrix, part.scale, edge_index[:, start:end], part.hidden_of,
                                 use_reentrant=False, preserve_rng_state=False)
            out = message if out is None else out + message
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for name in self._held:
            loaded, held = state_dict.get(prefix + name), self.get_buffer(name)
            if loaded is None or loaded.shape != held.shape or not held.is_floating_point():
                continue
            coarsest = max(torch.finfo(t.dtype).eps for t in (loaded, held) if t.is_floating_point())
            scale = max(1.0, held.abs().max().item()) if held.numel() else 1.0
            if not torch.allclose(loaded.to(held.device, torch.float64), held.to(torch.float64), rtol=0,
                                  atol=16 * coarsest * scale):
                error_msgs.append(f"{prefix}{name}: the values differ from those of the e3nn TensorProduct this "
                                  "Convolution was made from, which it computes with")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class _ChunkMessages:
    """One chunk's messages (:meth:`Convolution._deferred_messages`) as a checkpoint calls them: computed at the
    first call; at the next ones (the checkpoint recomputing, in the backward, the tensors the chunk's graph saved)
    the kernels only save their inputs (:func:`~sparse_accumulation.ops.dispatch.saving_only`), since the
    recomputed messages are discarded: the backward recomputes the chunk's weights, not its messages."""

    def __init__(self, convolution: Convolution):
        self.convolution, self.called = convolution, False

    def __call__(self, *args):
        if not self.called:
            self.called = True
            return self.convolution._deferred_messages(*args)
        with saving_only():
            return self.convolution._deferred_messages(*args)


def _mace_blocks():
    """``mace.modules.blocks`` (MACE's package with the dependencies its model code imports)."""
    try:
        return importlib.import_module("mace.modules.blocks")
    except ImportError as error:
        raise ImportError(f"sparse_accumulation.mace.accelerate needs mace-torch and the packages its models import "
                          f"({error}); see the MACE page of the documentation for the install") from error


def accelerate(model: torch.nn.Module, *, keep_unknown: bool = False,
               implementation: Optional[str] = None) -> torch.nn.Module:
    """Put a MACE model's convolutions, symmetric contractions and skip connections on this library's layers, in
    place.

    ``model`` is anything holding MACE's blocks as MACE builds or loads them: a ``MACE`` or ``ScaleShiftMACE``
    (or another MACE model class), an interaction block, a product block. Every interaction block of a class in
    :data:`INTERACTION_BLOCKS` gets a :class:`Convolution` as ``conv_tp`` (and MACE's ``conv_fusion`` attribute,
    which makes its ``forward`` call it as one fused convolution), every ``EquivariantProductBasisBlock`` gets
    :meth:`SymmetricContraction.from_mace(..., mace_buffers=True)
    <sparse_accumulation.mace.SymmetricContraction.from_mace>` as ``symmetric_contractions``, and every converted
    interaction block's ``skip_tp`` that is e3nn's ``FullyConnectedTensorProduct`` with node attributes of
    scalars becomes an :class:`~.element_linear.ElementLinear`, every e3nn ``o3.Linear`` a
    :class:`sparse_accumulation.e3nn.Linear`, every e3nn ``nn.FullyConnectedNet`` (the radial networks) a
    :class:`sparse_accumulation.e3nn.FullyConnectedNet` and e3nn's ``o3.SphericalHarmonics`` a
    :class:`sparse_accumulation.e3nn.SphericalHarmonics` and a ``RadialEmbeddingBlock`` of MACE's Bessel basis and
    polynomial cutoff a :class:`~.radial.RadialEmbedding` (and each converted interaction block's ``reshape`` a
    :class:`~.reshape.ReshapeIrreps`), each holding the parameters of the layer it replaces. The
    rest of the model (embeddings' other parts, activations, MACE's ``forward``) is not touched. A model with
    interaction blocks gets ``prepare_edges_first`` as a forward pre-hook (once). Energies, forces and stress equal
    MACE's to rounding; the state dict is MACE's, key for key. Blocks already converted are left as they are.
    Nothing is changed when an error is raised.

    Args:
        model: the MACE model or block (its parameters on any device, float32 or float64).
        keep_unknown: leave interaction blocks of other classes (subclasses included: their ``forward`` may not
            call the fused convolution) on MACE's code instead of raising; their product blocks are still
            converted.
        implementation: the kernels of the new layers (None: the library default).

    Returns:
        ``model``, converted.

    Raises:
        ImportError: mace-torch, or a package its model code imports, is not installed.
        TypeError: ``model`` is not a ``torch.nn.Module`` or holds no MACE interaction or product block.
        NotImplementedError: model options whose layers run on other kernels (an enabled ``cueq_config`` or
            ``oeq_config``, or their modules in place of e3nn's and MACE's), or, without ``keep_unknown``, an
            interaction block of a class not in :data:`INTERACTION_BLOCKS`; the message names each of them and
            where it is.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a MACE model or block), got {type(model).__name__}")
    blocks = _mace_blocks()
    from e3nn import o3

    mace_contraction = importlib.import_module("mace.modules.symmetric_contraction").SymmetricContraction
    known = tuple(getattr(blocks, name) for name in INTERACTION_BLOCKS)
    problems, interactions, products = [], [], []
    for name, module in model.named_modules():
        where = name or "the model"
        for attribute, library in _REFUSED_OPTIONS:
            config = getattr(module, attribute, None)
            if config is not None and getattr(config, "enabled", False):
                problems.append(f"{attribute} (enabled: {library} kernels) in {where}")
        if isinstance(module, blocks.InteractionBlock):
            if type(module) not in known:
                if not keep_unknown:
                    problems.append(f"interaction block class {type(module).__module__}.{type(module).__qualname__} "
                                    f"({where}; pass keep_unknown=True to leave it on MACE's code)")
            elif not isinstance(module.conv_tp, Convolution):
                if type(module.conv_tp) is not o3.TensorProduct:
                    problems.append(f"convolution of type {type(module.conv_tp).__module__}."
                                    f"{type(module.conv_tp).__qualname__} in {where} (e3nn's TensorProduct expected)")
                else:
                    interactions.append(module)
        elif isinstance(module, blocks.EquivariantProductBasisBlock):
            contraction = module.symmetric_contractions
            if not isinstance(contraction, SymmetricContraction):
                if type(contraction) is not mace_contraction:
                    problems.append(f"symmetric contraction of type {type(contraction).__module__}."
                                    f"{type(contraction).__qualname__} in {where} (MACE's SymmetricContraction "
                                    "expected)")
                else:
                    products.append(module)
    if problems:
        raise NotImplementedError("sparse_accumulation.mace.accelerate cannot run these parts of the model: "
                                  + "; ".join(problems))
    if not any(isinstance(m, (blocks.InteractionBlock, blocks.EquivariantProductBasisBlock))
               for m in model.modules()):
        raise TypeError(f"model holds no MACE interaction or product block: {type(model).__name__}")
    convolutions = [Convolution(block.conv_tp, implementation=implementation) for block in interactions]
    contractions = [SymmetricContraction.from_mace(block.symmetric_contractions, implementation=implementation,
                                                   mace_buffers=True) for block in products]
    skips = [ElementLinear(block.skip_tp) if ElementLinear.refusal(getattr(block, "skip_tp", None)) is None
             else None for block in interactions]
    reshapes = [_reshape_of(block) for block in interactions]
    layers = _e3nn_layers(model) + [(parent, name, RadialEmbedding(child)) for parent in model.modules()
                                    for name, child in parent.named_children()
                                    if RadialEmbedding.refusal(child) is None]
    for block, convolution, skip in zip(interactions, convolutions, skips):
        block.conv_tp = convolution
        block.conv_fusion = "sparse_accumulation"
        if skip is not None:
            block.skip_tp = skip
    for block, reshape in zip(interactions, reshapes):
        if reshape is not None:
            block.reshape = reshape
    for block, contraction in zip(products, contractions):
        block.symmetric_contractions = contraction
    for parent, name, layer in layers:
        setattr(parent, name, layer)
    for block in interactions:  # MACE's blocks scale the weights by the cutoff and hand them to conv_tp only
        if isinstance(getattr(block, "conv_tp_weights", None), FullyConnectedNet):
            block.conv_tp_weights.defer_last_layer = True
    if interactions and hasattr(model, "interactions") and not getattr(model, _PREPARES_EDGES, False):
        model.register_forward_pre_hook(prepare_edges_first, with_kwargs=True)
        model.register_forward_hook(_end_capture_scope, always_call=True)
        setattr(model, _PREPARES_EDGES, True)
        # torch.jit.script asks for this first (MACE's jit.compile, its LAMMPS export): the hook does not script
        model.__prepare_scriptable__ = functools.partial(_without_edge_hook, model)
    return model


_PREPARES_EDGES = "_sparse_accumulation_prepares_edges"


def _reshape_of(block: torch.nn.Module) -> Optional[ReshapeIrreps]:
    """The :class:`~.reshape.ReshapeIrreps` of ``block.reshape`` on the device of the block's parameters, or None
    where there is none to convert (not MACE's ``reshape_irreps`` of e3nn's layout, or irreps of several
    multiplicities)."""
    try:
        reshape = ReshapeIrreps.from_mace(getattr(block, "reshape", None))
    except (TypeError, ValueError):
        return None
    like = next(block.parameters(), None)
    return reshape if like is None else reshape.to(like.device)


def _without_edge_hook(model: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy of the converted ``model`` without :func:`prepare_edges_first` (what TorchScript compiles:
    the hook reads index values, which a scripted model cannot; its convolutions prepare the edges themselves)."""
    scriptable = copy.copy(model)
    del scriptable.__dict__["__prepare_scriptable__"]
    scriptable._forward_pre_hooks = OrderedDict((key, hook) for key, hook in model._forward_pre_hooks.items()
                                                if hook is not prepare_edges_first)
    scriptable._forward_pre_hooks_with_kwargs = {key: value for key, value in
                                                 model._forward_pre_hooks_with_kwargs.items()
                                                 if key in scriptable._forward_pre_hooks}
    scriptable._forward_hooks = OrderedDict((key, hook) for key, hook in model._forward_hooks.items()
                                            if hook is not _end_capture_scope)
    scriptable._forward_hooks_always_called = {key: value for key, value in
                                               model._forward_hooks_always_called.items()
                                               if key in scriptable._forward_hooks}
    return scriptable


#: per thread: the (model, entered capture scope) pairs of captured calls under way, innermost last
_open_scopes = threading.local()


def _capturing(data) -> bool:
    edge_index = data.get("edge_index") if isinstance(data, dict) else None
    return isinstance(edge_index, torch.Tensor) and indices.capturing(edge_index)


def _end_capture_scope(model, args, output) -> None:
    """Forward hook (run also when the call raises): close the capture scope ``prepare_edges_first`` opened."""
    if torch.compiler.is_compiling():
        return
    stack = getattr(_open_scopes, "stack", None)
    if stack and stack[-1][0] is model:
        stack.pop()[1].__exit__(None, None, None)


def prepare_edges_first(model, args, kwargs) -> None:
    """Forward pre-hook of a converted MACE model: check the batch's ``edge_index`` rows as the convolutions
    will, before the model queues any GPU work. Checking reads the index values back (one
    synchronisation per new ``edge_index``); here the device has almost nothing queued to wait for, where inside
    the first convolution it waits for the radial networks and then idles while the host catches up. The
    convolutions find the prepared rows (:func:`sparse_accumulation.indices.prepared_index`). Bad indices are
    left for the convolutions to report. A call being captured into a CUDA graph reads nothing: it opens a
    :func:`~sparse_accumulation.indices.capture_scope` instead, closed by the model's forward hook."""
    if torch.compiler.is_compiling():  # a compiled graph reads no index values (and dynamo traces no further)
        return
    data = args[0] if args else kwargs.get("data")
    if _capturing(data):  # nothing may be read; the layers share what they make until the call ends
        scope = indices.capture_scope()
        scope.__enter__()
        if not hasattr(_open_scopes, "stack"):
            _open_scopes.stack = []
        _open_scopes.stack.append((model, scope))
        return
    if not isinstance(data, dict) or torch.is_inference_mode_enabled():  # nothing made there is kept
        return
    edge_index, nodes = data.get("edge_index"), data.get("node_attrs", data.get("positions"))
    if not (isinstance(edge_index, torch.Tensor) and isinstance(nodes, torch.Tensor) and edge_index.dim() == 2
            and edge_index.shape[0] == 2 and not edge_index.dtype.is_floating_point and nodes.dim() >= 1
            and rememberable((edge_index,))):
        return
    for row in (0, 1):
        try:
            prepared_index("edge_index", edge_index[row], nodes.shape[0])
        except (IndexError, ValueError, TypeError):
            return


def _e3nn_layers(model: torch.nn.Module) -> list:
    """``(parent, name, replacement)`` for each of the model's e3nn ``o3.Linear`` (without e3nn's ``f_in``),
    ``nn.FullyConnectedNet`` and ``o3.SphericalHarmonics`` (degrees up to ``HARMONICS_MAX_L``; made in the dtype
    and on the device of the model's first floating parameter, since e3nn's holds no tensor)."""
    from e3nn import nn, o3

    from ..e3nn.recognised import Linear  # an o3.Linear to MACE's LoRA

    like = next((t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()), None)
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is o3.Linear and child.weight.dim() <= 1:
                found.append((parent, name, Linear.from_e3nn(child)))
            elif type(child) is nn.FullyConnectedNet:
                found.append((parent, name, FullyConnectedNet.from_e3nn(child)))
            elif type(child) is o3.SphericalHarmonics and child._lmax <= HARMONICS_MAX_L:
                harmonics = SphericalHarmonics.from_e3nn(child)
                found.append((parent, name, harmonics if like is None else harmonics.to(like.device, like.dtype)))
    return found
