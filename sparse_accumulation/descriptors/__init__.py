"""The mathematics of the operations, as descriptors: immutable, interned, named by keys that encode them whole
(:mod:`.interning`), numpy only.

* :class:`~.rules.Rule`: the index arrays of a sparse accumulation (and the rules of its gradients);
* :class:`~.channel_rules.ChannelRule`: a rule applied per channel, with the columns of each operand
  (:class:`~.channel_rules.ColumnMap`): what the graph operation computes;
* :class:`~.programs.Program`: sums of products of per-node and per-element operands (MACE's symmetric
  contraction), closed under differentiation.
"""
from .channel_rules import ChannelRule, ColumnMap
from .programs import Program, Slot
from .rules import Rule

__all__ = ["Rule", "ChannelRule", "ColumnMap", "Program", "Slot"]
