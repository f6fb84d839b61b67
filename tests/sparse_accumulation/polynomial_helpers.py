"""Random element-weighted polynomial programs and a brute-force float64 reference for their tests."""
import numpy as np
import torch

from sparse_accumulation.indices import Elements
from sparse_accumulation.descriptors.programs import ELEMENT, LANE, Program, element_slot, lane_slot


def random_program(generator, channels=3, size_x=4, size_p=6, size_out=3, terms=12, max_degree=3):
    """A program with operands ``x`` (lane ``[N, channels * size_x]``), ``P`` (element, ``[E, size_p *
    channels]``) and ``z`` (lane, ``[N, channels * 2]``), one lane output; terms of 1 to ``max_degree`` factors
    of x, at most one of P, at most one of z, some repeated (merged by the program)."""
    draw = lambda high, n=1: torch.randint(0, high, (n,), generator=generator).tolist()  # noqa: E731
    made = []
    for _ in range(terms):
        factors = [(0, m) for m in draw(size_x, draw(max_degree)[0] + 1)]
        if draw(3)[0]:
            factors.append((1, draw(size_p)[0]))
        if draw(4)[0] == 0:
            factors.append((2, draw(2)[0]))
        coefficient = torch.randn(1, generator=generator, dtype=torch.float64).item()
        made.append((draw(size_out)[0], coefficient, factors))
    made.append(made[0])  # a repeated term
    operands = (lane_slot(size_x, channels), element_slot(size_p, channels), lane_slot(2, channels))
    return Program(channels, operands, (lane_slot(size_out, channels),), [made])


def random_elements(generator, nodes: int, num_elements: int) -> Elements:
    """Elements of ``nodes`` nodes, every element present when there are enough nodes, in random order."""
    values = torch.randint(0, num_elements, (nodes,), generator=generator)
    values[:min(nodes, num_elements)] = torch.arange(min(nodes, num_elements))
    return Elements(values[torch.randperm(nodes, generator=generator)], num_elements)


def random_operands(generator, program, nodes: int, num_elements: int, dtype=torch.float64) -> list:
    rows = {LANE: nodes, ELEMENT: num_elements}
    return [torch.randn(rows[s.kind], s.width, generator=generator, dtype=torch.float64).to(dtype)
            for s in program.operands]


def reference(program, tensors, elements: Elements, outputs=None) -> list:
    """Every output by its definition, term by term, node by node, channel by channel, in float64 numpy."""
    outputs = range(len(program.outputs)) if outputs is None else outputs
    values = [t.detach().double().numpy() for t in tensors]
    node_element = elements.tensor.numpy()
    B = program.channels
    results = []
    for j in outputs:
        slot = program.outputs[j]
        out = np.zeros((len(node_element) if slot.kind == LANE else elements.num_elements, slot.width))
        for n, e in enumerate(node_element):
            row = n if slot.kind == LANE else e
            for component, coefficient, factors in program.terms[j]:
                for b in range(B):
                    product = coefficient
                    for s, m in factors:
                        operand = program.operands[s]
                        column = operand.map.base[m] + b * operand.map.step[m]
                        product *= values[s][n if operand.kind == LANE else e, column]
                    out[row, slot.map.base[component] + b * slot.map.step[component]] += product
        results.append(torch.from_numpy(out))
    return results
