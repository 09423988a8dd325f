"""The framework seam's contract, clause by clause.

Each clause builds the family's framework over its own compiler, library,
runtime and driver on fresh simulated devices, and checks the face a front
end relies on: the device type and ``torch.version`` fields, device
properties that agree with the driver, an autocast policy torch can apply,
routes for graph and ATen ops, and a graph run whose numbers match a float64
reference.
"""

from __future__ import annotations

import numpy as np

from ..layers.compiler import Target
from ..layers.face import AUTOCAST_DTYPES, TORCH_VERSION_FIELDS
from .base import ContractFailure, Subject, add_relu_graph, clause, expect_error, require, rng_arrays

SEAM = "framework"
N = 257


def _framework(s: Subject):
    """The family's framework, composed as a stack composes it, and its driver."""
    drv = s.driver()
    rt = s.runtime()
    lib = s.vendor.library(rt)
    comp = s.vendor.compiler()
    props = drv.properties(0)
    loadable = set(drv.loadable_formats(0))
    fmt = next((f for f in comp.output_formats() if f in loadable), None)
    if fmt is None:
        raise ContractFailure(f"the family's compiler emits {comp.output_formats()}, none of which the "
                              f"driver loads ({sorted(loadable)})")
    return s.vendor.framework(comp, lib, rt, Target(props.target, fmt, props.compute_units)), drv


@clause(SEAM, "F01", "presents a face: device type, device module, torch.version fields")
def face(s: Subject) -> None:
    fw, _ = _framework(s)
    f = fw.face
    require(isinstance(f.device_type, str) and f.device_type, f"device_type is {f.device_type!r}")
    require(f.module == f"torch.{f.device_type}",
            f"a '{f.device_type}' device lives in torch.{f.device_type}, face says {f.module!r}")
    require(isinstance(f.dist_backend, str) and f.dist_backend, "no distributed backend name")
    v = fw.versions()
    require(set(v) == set(TORCH_VERSION_FIELDS),
            f"versions() must give torch.version's {', '.join(TORCH_VERSION_FIELDS)}, got {sorted(v)}")
    require(v.get(f.version_field) == f.version and f.version,
            f"torch.version.{f.version_field} is {v.get(f.version_field)!r}, the face says {f.version!r}")


@clause(SEAM, "F02", "describes each device as its driver does")
def device_properties(s: Subject) -> None:
    fw, drv = _framework(s)
    for index in range(len(s.devices)):
        p = fw.device_properties(drv, index)
        require(isinstance(p, dict) and p.get("name"), f"device_properties({index}) has no name")
        mem = drv.properties(index).memory_bytes
        require(p.get("total_memory") == mem,
                f"device_properties({index})['total_memory'] is {p.get('total_memory')}, the driver "
                f"reports {mem}")
    expect_error(lambda: fw.device_properties(drv, len(s.devices)), "device_properties(device_count())")


@clause(SEAM, "F03", "has an autocast policy torch can apply")
def autocast(s: Subject) -> None:
    fw, _ = _framework(s)
    pol = fw.autocast_policy()
    require(pol.device_type == fw.face.device_type,
            f"the policy is for {pol.device_type!r}, the face is {fw.face.device_type!r}")
    require(set(pol.dtypes) <= set(AUTOCAST_DTYPES) and pol.default_dtype in pol.dtypes,
            f"default {pol.default_dtype!r} of dtypes {pol.dtypes}: torch.autocast takes "
            f"{', '.join(AUTOCAST_DTYPES)}")
    require(pol.cast("aten::mm") == "lower_precision_fp", "autocast does not lower aten::mm")
    require(str(pol.cast("aten::softmax.int")).startswith("fp32"),
            "autocast does not keep aten::softmax.int in float32")
    require(pol.cast("aten::relu") is None, "autocast casts aten::relu, which torch leaves alone")


@clause(SEAM, "F04", "routes graph ops and ATen ops with reasons")
def routes(s: Subject) -> None:
    fw, _ = _framework(s)
    r = fw.route("add")
    require(r.kind in ("native", "decomposed"), f"add routes to {r.kind!r}")
    r = fw.route("no_such_op")
    require(r.kind == "fallback" and r.reason, f"an op with no device kernel routes to {r.kind!r}")
    for op in ("aten::mm", "aten::_softmax", "aten::linalg_eig", "aten::no_such_op"):
        t = fw.torch_route(op)
        require(t is None or (t.kind in ("decomposed", "fallback") and t.reason),
                f"torch_route({op!r}) gave {t!r}: None or a decomposed/fallback route with a reason")


@clause(SEAM, "F05", "runs a graph on the device and reports it")
def run(s: Subject) -> None:
    fw, _ = _framework(s)
    a, b = rng_arrays(N, seed=11)
    res = fw.run(add_relu_graph(N), {"a": a, "b": b})
    ref = np.maximum(a.astype(np.float64) + b, 0)
    require(np.allclose(res.outputs[0], ref, rtol=1e-6, atol=1e-6), "relu(a + b) came back wrong")
    rep = fw.report()
    require(isinstance(rep, dict) and rep.get("vendor") == s.vendor.name,
            f"report() must be a dict naming the vendor, got {str(rep)[:80]}")
    require(rep.get("versions") == fw.versions(), "report() does not carry versions()")
