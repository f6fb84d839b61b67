"""e3nn's tensor products on this library's kernels: :class:`TensorProduct` (and e3nn's products of fixed
instructions, :class:`FullyConnectedTensorProduct`, :class:`ElementwiseTensorProduct`, :class:`FullTensorProduct`,
:class:`TensorSquare`, :mod:`.sub`) takes e3nn's constructor and call
(and cuEquivariance's message-passing keywords), computing a whole product as one weighted sparse accumulation
(:mod:`.tensor_product`; how e3nn's layouts map onto it: :mod:`.layout`); e3nn's :class:`Linear` and
:class:`FullyConnectedNet` with lighter gradients; e3nn's :class:`SphericalHarmonics` as one matrix product.
e3nn itself is imported when a layer is made.
"""
from .tensor_product import (E3NN_MODES, IRREP_NORMALIZATIONS, PATH_NORMALIZATIONS, SUPPORTED_MODES, Instruction,
                             InvalidArgumentError, IrrepIndexError, LeadingDimensionsError, TensorProduct,
                             UnknownModeError, WeightsMissingError)
from .fully_connected import DeferredWeights, FullyConnectedNet
from .linear import Linear
from .spherical_harmonics import SphericalHarmonics
from .sub import ElementwiseTensorProduct, FullTensorProduct, FullyConnectedTensorProduct, TensorSquare

__all__ = ["TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
           "TensorSquare", "Linear", "FullyConnectedNet", "SphericalHarmonics", "DeferredWeights", "Instruction",
           "SUPPORTED_MODES", "E3NN_MODES", "IRREP_NORMALIZATIONS", "PATH_NORMALIZATIONS", "InvalidArgumentError",
           "WeightsMissingError", "IrrepIndexError", "UnknownModeError", "LeadingDimensionsError"]
