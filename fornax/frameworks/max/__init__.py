"""A MAX-style front end: build a graph from typed tensor values and ops, with custom ops
whose kernels you write in fornax's tile-ISA builder, and run it whole on a composed stack.

It is modelled on the public shape of MAX's Python graph API (a graph built from input
types, ``ops``, ``TensorValue`` operators, an inference session that loads the graph and
executes it) -- a MAX-*style* API on fornax, not MAX itself::

    import numpy as np
    from fornax.frameworks.max import DType, Graph, InferenceSession, TensorType, ops

    with Graph("mlp", input_types=[TensorType(DType.float32, (8, 16))]) as g:
        x, = g.inputs
        g.output(ops.relu(x @ ops.constant(np.ones((16, 4), np.float32))))
    model = InferenceSession(vendor="rocm-like").load(g)
    y, = model.execute(np.ones((8, 16), np.float32))

Where the hardware boundary sits: the whole graph goes to the stack's graph compiler
(fusion, library routing, kernel choice), and a custom op's kernel to the library seam;
nothing is dispatched op by op (:mod:`.engine`).
"""

from . import ops
from .engine import InferenceSession, Model
from .graph import CustomOp, DType, Graph, TensorType, TensorValue
from .reference import evaluate

__all__ = ["CustomOp", "DType", "Graph", "InferenceSession", "Model", "TensorType", "TensorValue",
           "evaluate", "ops"]
