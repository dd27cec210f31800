"""A catalog layer table as the graph AccPar partitions: conv/linear nodes and their edges.

Only convolutions and linear layers are partitioned (AccPar models a layer as a matrix
product; docs/references.md). Every other layer (batch norm, pooling, attention core,
embedding, activations already folded by the catalog) *follows the partition of the layer
whose output it consumes*, its **owner**:

- its FLOPs are added to the owner's and are split with the owner's output (types I and
  III split the output; type II makes the output FULL, so both sides repeat that work);
- its parameters (e.g. batch-norm scale and shift) live with the owner's output channels:
  replicated under types I and II, split under type III; under type I their gradients are
  partial sums and are reduced together with the owner's weight gradient;
- its activations pass through at no communication cost (they stay in the owner's layout);
  the activation it keeps for backward counts towards memory like the owner's output.

Layers before the first conv/linear (embeddings, a leading norm) are owned by the first
partitioned layer. The network input costs nothing to lay out: every side reads its part.
A table whose other layers hold more than half of the parameters (DLRM's and NeuMF's
embeddings, an LSTM) is refused: the model would price those as dense replicated weights.

Building the graph (steps):

1. a layer's input is the previous layer's output, unless the sizes disagree: then it is
   the nearest earlier tensor (a layer's input or output) of the right size. This finds
   the block input for the first main-path convolution of a residual block, which the
   catalog lists after the projection shortcut (docs of workloads/catalog/cnn.py). Tables
   of other families (recommenders, BERT's pooler) fall back as :func:`layer_inputs` says;
   their second inputs (``shortcut_from``) are priced as joins, an approximation;
2. a conv/linear layer becomes a node with an **input edge** from the owner of its input
   tensor (none when it reads the network input, in which case no error flows back, so
   type III has no partial sums to reduce and the backward pass skips the input gradient);
3. a layer with ``shortcut_from`` adds the output of that layer to its own; this is a
   **join edge** from the owner of the shortcut tensor to the owner of the joined tensor
   (the sum lives in the layout of the joining layer's output);
4. the tensor an edge moves: for an input edge, the consumer's input (``in_elems`` per
   sample, scaled by the consumer's batch and C_in shares); for a join, the joined output
   (scaled by the joining node's batch and C_out shares).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlcomm.errors import ConfigError
from dlcomm.workloads.catalog.base import Layer, ModelTable

__all__ = ["PARTITIONED_KINDS", "Node", "Edge", "PartitionGraph", "build_graph", "layer_inputs",
           "MAX_UNPARTITIONED"]

PARTITIONED_KINDS = ("conv", "linear")
MAX_UNPARTITIONED = 0.5  # largest share of the parameters in layers that cannot be split


@dataclass(frozen=True)
class Node:
    """One partitioned layer plus the non-partitioned layers it owns (per sample)."""

    index: int
    name: str
    kind: str                 # conv | linear
    c_in: int
    c_out: int
    kernel: int
    params: int               # the layer's own parameters (weights and bias)
    flops: float              # the layer's own forward FLOPs per sample
    in_elems: int             # input activation elements per sample
    out_elems: int            # output activation elements per sample
    takes_input: bool         # reads the network input: no input gradient is needed
    fold_flops: float = 0.0   # forward FLOPs per sample of the layers it owns
    fold_params: int = 0      # parameters of the layers it owns
    fold_elems: int = 0       # activation elements per sample those layers keep
    owns: tuple[str, ...] = ()  # names of the layers it owns


@dataclass(frozen=True)
class Edge:
    src: int                  # node whose layout the tensor has
    dst: int                  # node that needs it (input) or joins it (join)
    kind: str                 # "input" | "join"
    elems: int                # elements per sample of the tensor moved
    via: str = ""             # the table layer that carries the join (for reports)


@dataclass(frozen=True)
class PartitionGraph:
    name: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    arrays: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def col(attr: str) -> np.ndarray:
            return np.array([float(getattr(n, attr)) for n in self.nodes])
        for attr in ("params", "flops", "in_elems", "out_elems", "fold_flops", "fold_params",
                     "fold_elems", "c_in", "c_out"):
            self.arrays[attr] = col(attr)
        self.arrays["takes_input"] = np.array([n.takes_input for n in self.nodes])
        self.arrays["is_linear"] = np.array([n.kind == "linear" for n in self.nodes])

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


def layer_inputs(table: ModelTable) -> list[int]:
    """For every layer, the index of the layer whose output it reads (-1: the network input).

    Step 1 of the module docstring: the previous layer's output, unless the sizes disagree;
    then the nearest earlier output (or the network input) of the right size. If there is
    none, an embedding reads the network input (its lookups come with the data) and any
    other layer reads a part of the previous output (BERT's pooler takes the first token;
    NeuMF and DLRM concatenate the previous output with the ``shortcut_from`` input).
    """
    inputs: list[int] = []
    outputs: list[tuple[int, int]] = []  # (layer index or -1, elements) in creation order
    for i, layer in enumerate(table.layers):
        if i == 0:
            outputs.append((-1, layer.in_elems))
            inputs.append(-1)
        elif outputs[-1][1] == layer.in_elems:
            inputs.append(outputs[-1][0])
        else:
            found = [idx for idx, elems in reversed(outputs) if elems == layer.in_elems]
            fallback = -1 if layer.kind == "embedding" else outputs[-1][0]
            inputs.append(found[0] if found else fallback)
        outputs.append((i, layer.out_elems))
    return inputs


def build_graph(table: ModelTable) -> PartitionGraph:
    """The partition graph of a layer table (steps in the module docstring)."""
    part = [i for i, layer in enumerate(table.layers) if layer.kind in PARTITIONED_KINDS]
    if not part:
        raise ConfigError(f"model {table.name!r} has no conv or linear layer to partition")
    other = sum(x.params for x in table.layers if x.kind not in PARTITIONED_KINDS)
    if other > MAX_UNPARTITIONED * max(table.params, 1):
        kinds = sorted({x.kind for x in table.layers
                        if x.kind not in PARTITIONED_KINDS and x.params})
        raise ConfigError(f"{table.name}: {other / table.params:.0%} of its parameters are in "
                          f"{'/'.join(kinds)} layers, which AccPar's model does not split "
                          "(it partitions conv and linear layers)")
    first = part[0]
    leading_params = sum(layer.params for layer in table.layers[:first])
    node_of_layer = {layer_i: k for k, layer_i in enumerate(part)}

    owner: dict[int, int | None] = {-1: None}   # layer index -> node owning its output
    fold: dict[int, list[Layer]] = {k: [] for k in range(len(part))}
    edges: list[Edge] = []
    takes_input = [False] * len(part)
    index_of = {layer.name: i for i, layer in enumerate(table.layers)}
    for i, (layer, src) in enumerate(zip(table.layers, layer_inputs(table))):
        src_owner = owner[src]
        if i in node_of_layer:
            k = node_of_layer[i]
            if src_owner is None:
                takes_input[k] = leading_params == 0
            else:
                edges.append(Edge(src_owner, k, "input", layer.in_elems))
            out_owner: int | None = k
        else:
            out_owner = src_owner
            fold[node_of_layer[first] if src_owner is None else src_owner].append(layer)
        if layer.shortcut_from is not None:
            shortcut_owner = owner[index_of[layer.shortcut_from]]
            if None not in (shortcut_owner, out_owner) and shortcut_owner != out_owner:
                edges.append(Edge(shortcut_owner, out_owner, "join", layer.out_elems,
                                  via=layer.name))
        owner[i] = out_owner

    nodes = []
    for k, i in enumerate(part):
        layer = table.layers[i]
        owned = fold[k]
        nodes.append(Node(k, layer.name, layer.kind, layer.c_in, layer.c_out, layer.kernel,
                          layer.params, layer.flops, layer.in_elems, layer.out_elems,
                          takes_input[k], sum(x.flops for x in owned),
                          sum(x.params for x in owned), sum(x.in_elems for x in owned),
                          tuple(x.name for x in owned)))
    return PartitionGraph(table.name, tuple(nodes), tuple(edges))
