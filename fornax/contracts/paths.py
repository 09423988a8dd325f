"""Conformance of a portability path: a seam of one family over another family's driver.

``fornax conform compiler --vendor rocm-like --over cuda-like`` checks the rocm-like compiler
as it reaches a cuda-like driver (HIP on NVIDIA here): the subject is the driver's family with
its compiler replaced by the composed one, so the driver suite loads what the path carries
and the compiler suite runs every op through it on the foreign driver.  ``conform library
--vendor xpu-like --over rocm-like`` checks the marshalling library (oneMath's rocBLAS
backend) under the library family's name.  ``path`` picks among several declared paths, as
``fornax compose --path`` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..layers.errors import ConfigError
from ..layers.marshal import MarshallingLibrary, marshal_paths
from ..layers.vendor import Vendor
from ..stack import compose, get_vendor, make_config

#: the seams whose implementations cross to a foreign driver by a declared path
PATH_SEAMS = ("compiler", "library")


def path_subject(seam: str, vendor: str, over: str, path: str | None = None) -> tuple[Vendor, dict[str, Any]]:
    """The Vendor a suite runs on to check ``vendor``'s ``seam`` over ``over``'s driver, and the
    crossing that carries it (as ``negotiation.crossings`` reports it)."""
    if seam not in PATH_SEAMS:
        raise ConfigError(f"--over checks a seam that reaches a foreign driver by a path: "
                          f"{', '.join(PATH_SEAMS)}, not {seam}",
                          hint=f"run `fornax conform {seam} --vendor {over}` for the driver family's own")
    if vendor == over:
        raise ConfigError(f"--over {over} is {vendor}'s own family: nothing crosses",
                          hint="drop --over to check the family's own seam")
    stack = compose(make_config(over, seams={seam: vendor}, spec="tiny", paths=[path] if path else None))
    boundary = f"{seam}/driver"
    crossing = next(c for c in stack.negotiation["crossings"] if c["boundary"] == boundary)
    back = get_vendor(over)
    if seam == "compiler":
        return dataclasses.replace(back, compiler=lambda: stack.compiler), crossing
    front = get_vendor(vendor)
    mpath = next(m for m in marshal_paths(front.facts, front.name)
                 if m.backend == over and m.name == crossing["name"])

    def library(runtime: Any) -> MarshallingLibrary:
        return MarshallingLibrary(mpath, front.facts["library"]["name"], back.library(runtime))
    # the driver family's seams under the library family's name: the report names the API the
    # user composed (hipBLAS-like over cuBLAS-like reports rocm-like)
    return dataclasses.replace(back, name=vendor, library=library), crossing
