"""Tensor parallelism's own costs beside its collectives: DTensor's host work, and the step at
other tensor-parallel degrees.

DTensor's host work: the ops a trace shows for a tensor subclass's dispatch (``PythonSubclass``:
the sharding propagation in Python beside each op), its redistributions, the conversions to and
from DTensor and the functional collectives' issuing (a functional collective's wait is
communication's), their self time a step. Data parallelism does none of it, and it does not
shrink with a smaller shard of each layer.

The step at g' ranks of tensor parallelism for the same global batch, from g measured
(doctor.analyse.kind_scaling's sharded model with the tensor role): each layer's shard, and so
the compute outside DTensor's host work, divides by g'/g; DTensor's host work stays; each
all-reduce still moves the same activations, 2(g'-1)/g' of them over each link, a latency per
ring hop; the exposed share of that communication kept as measured.
"""

from __future__ import annotations

import pandas as pd

#: DTensor's own host ops in a trace (a tensor subclass's dispatch, its redistributions, the
#: conversions, the functional collectives' issuing; a functional collective's wait is
#: communication's): what data parallelism does not do.
DTENSOR_OPS = ("PythonSubclass", "Redistribute", "NestedRedistribute", "_FromTorchTensor",
               "_ToTorchTensor", "_FromTorchTensorBackward", "_ToTorchTensorBackward")
FUNCTIONAL_ISSUE = ("_c10d_functional::", "c10d_functional::")


def dtensor_host_s(ops: pd.DataFrame, steps: int) -> float:
    """DTensor's own host time a step (DTENSOR_OPS and the functional collectives' issuing, their
    self time) in a rank's op table (``op``, ``self_s``) over ``steps`` window steps."""
    if ops.empty or "op" not in ops or "self_s" not in ops or steps <= 0:
        return 0.0
    name = ops["op"].astype(str)
    mine = name.isin(DTENSOR_OPS) | (name.str.startswith(FUNCTIONAL_ISSUE)
                                     & ~name.str.endswith("::wait_tensor"))
    return float(ops.loc[mine, "self_s"].sum()) / steps
