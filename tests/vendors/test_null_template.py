"""The null vendor is the reference skeleton: each of its five seams is an instance of its
Protocol, and every hook raises a fornax error naming the hook, the file to write it in and
the Protocol that is its contract."""

from __future__ import annotations

import inspect
import typing

import pytest

from fornax.layers.compiler import Compiler
from fornax.layers.driver import Driver
from fornax.layers.errors import NotSupportedError
from fornax.layers.framework import Framework
from fornax.layers.library import Library
from fornax.layers.runtime import Runtime
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor

PROTOCOLS = {"driver": Driver, "runtime": Runtime, "library": Library, "compiler": Compiler,
             "framework": Framework}


def _seams() -> dict:
    v = get_vendor("null")
    drv = v.driver([Device(load_spec("tiny"), 0)])
    rt = v.runtime(drv)
    lib = v.library(rt)
    comp = v.compiler()
    return {"driver": drv, "runtime": rt, "library": lib, "compiler": comp,
            "framework": v.framework(comp, lib, rt, None)}


@pytest.mark.parametrize("seam", PROTOCOLS)
def test_each_null_seam_is_an_instance_of_its_protocol(seam):
    obj, proto = _seams()[seam], PROTOCOLS[seam]
    members = typing._get_protocol_attrs(proto)
    assert all(hasattr(type(obj), m) or m in vars(obj) for m in members), \
        sorted(m for m in members if not (hasattr(type(obj), m) or m in vars(obj)))
    if seam != "framework":          # its ``face`` is a property that raises until implemented
        assert isinstance(obj, proto)


@pytest.mark.parametrize("seam", PROTOCOLS)
def test_every_hook_names_what_to_implement_and_where(seam):
    obj, proto = _seams()[seam], PROTOCOLS[seam]
    hooks = sorted(m for m in typing._get_protocol_attrs(proto) if callable(getattr(proto, m, None)))
    assert hooks
    for hook in hooks:
        params = [p for n, p in inspect.signature(getattr(proto, hook)).parameters.items()
                  if n != "self" and p.default is inspect.Parameter.empty
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        with pytest.raises(NotSupportedError) as info:
            getattr(obj, hook)(*[None] * len(params))
        err = info.value
        assert err.message == f"not implemented: {seam}.{hook}" and err.vendor == "null"
        assert f"{hook}() in your package's {seam}.py" in err.hint, err.hint
        assert f"fornax.layers.{seam}." in err.hint


@pytest.mark.parametrize("seam", PROTOCOLS)
def test_conform_on_the_template_fails_every_clause_naming_a_hook(seam):
    """`fornax conform SEAM --vendor null`: exit 1, no clause passes, and each failure names
    the hook it reached and where to implement it."""
    import json

    from click.testing import CliRunner

    from fornax.cli.main import main

    res = CliRunner().invoke(main, ["conform", seam, "--vendor", "null", "--json"])
    assert res.exit_code == 1, res.output[-2000:]
    doc = json.loads(res.stdout)
    assert doc["seam"] == seam and doc["passed"] == 0 and doc["failed"] == len(doc["clauses"]) > 0
    for clause in doc["clauses"]:
        detail = clause["detail"]
        assert "NotSupportedError" in detail and "/null]" in detail, detail
        hook = detail.split("not implemented: ", 1)[1].split(" ", 1)[0]
        assert hook.split(".")[0] in PROTOCOLS and "docs/new-vendor.md" in detail, detail
