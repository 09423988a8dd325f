"""pytest plugin: run the conformance suites on any implementation.

    pytest --pyargs fornax.contracts --fornax-impl mypackage.vendor:VENDOR
    pytest --pyargs fornax.contracts --fornax-impl rocm-like --fornax-seam driver

Each clause of each selected suite becomes one test named
``IMPL-SEAM-CLAUSE``.  Without ``--fornax-impl`` the built-in families are
checked.
"""

from __future__ import annotations



def _families() -> list[str]:
    from ..stack import runnable_vendors
    return runnable_vendors()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("fornax", "fornax conformance suites")
    group.addoption("--fornax-impl", action="append", default=[], metavar="IMPL",
                    help="a registered vendor name or package.module:ATTR naming a fornax Vendor "
                         "(repeatable; default: the built-in families)")
    group.addoption("--fornax-seam", action="append", default=[], metavar="SEAM",
                    help="only this seam's suite (repeatable; default: every suite)")


def pytest_generate_tests(metafunc) -> None:
    if "fornax_clause" not in metafunc.fixturenames:
        return
    from .suites import SUITES
    impls = metafunc.config.getoption("fornax_impl") or list(_families())
    seams = metafunc.config.getoption("fornax_seam") or sorted(SUITES)
    params, ids = [], []
    for impl in impls:
        for seam in seams:
            for c in SUITES.get(seam, []):
                params.append((impl, c))
                ids.append(f"{impl}-{seam}-{c.id}")
    metafunc.parametrize(("fornax_impl", "fornax_clause"), params, ids=ids)
