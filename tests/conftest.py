"""Suite-wide fixtures."""

import gc
import os

# One BLAS / OpenMP thread per process: the two test workers, and the processes tests start
# (which inherit this), already share the machine's cores; a second thread per process only
# contends (OpenBLAS threads spin while they wait).  ``make test`` sets these for the workers
# themselves (a pytest plugin imports numpy before this file runs); here they reach the
# processes a test starts when pytest runs without make.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

from families import FAMILY_OBJECTS, expected_failures  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _no_disk_compile_cache():
    """Tests never share compiled plans through the user's cache directory: the disk level of
    the compile cache is off unless a test points FORNAX_CACHE_DIR at its own tmp_path."""
    old = os.environ.get("FORNAX_CACHE_DIR")
    os.environ["FORNAX_CACHE_DIR"] = "off"
    yield
    if old is None:
        os.environ.pop("FORNAX_CACHE_DIR", None)
    else:
        os.environ["FORNAX_CACHE_DIR"] = old


#: the longest test files (subprocess runs of PyTorch's harness, qualification, executed
#: pages), collected first, so the two workers of ``make test`` (``--dist loadfile``) start on
#: them and share the lighter files at the end instead of one finishing a long file alone
HEAVY_FIRST = ("tests/cli/test_qualify.py", "tests/pytorch/test_torch_suite_sample_",
               "tests/test_docs_pages.py", "tests/pytorch/test_torch_suite_runner.py")


def pytest_collection_finish(session):
    """Every test module is imported (torch, jax, transformers and fornax with them): those
    objects live until the end, so the cyclic collector stops walking them (``gc.freeze``);
    a full collection otherwise re-walks a heap of a million objects every few thousand
    launches.  Objects created by the tests are collected as usual."""
    gc.freeze()


def pytest_collection_modifyitems(session, config, items):
    def heavy(item) -> int:
        path = item.nodeid.replace("\\", "/")
        return next((i for i, p in enumerate(HEAVY_FIRST) if path.startswith(p) or f"/{p}" in path),
                    len(HEAVY_FIRST))
    items.sort(key=heavy)            # stable: the order within each part is kept
    _mark_expected_failures(config, items)


@pytest.fixture(params=FAMILY_OBJECTS, ids=str)
def family(request):
    """Each built-in family with its capability tags (tests/families.py): a test asks
    ``family.has("graph-capture")``, not for a family's name."""
    return request.param


def _family_of(item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    for key in ("family", "vendor"):
        if key in params:
            return str(params[key])
    return None


def _mark_expected_failures(config, items) -> None:
    """tests/expected_failures.toml: per family, test ids known to fail, as strict xfails; an
    entry naming no collected test of a collected file is an error (a stale table)."""
    table = expected_failures()
    if not any(table.values()):
        return
    by_id = {item.nodeid.replace("\\", "/"): item for item in items}
    files = {nid.split("::")[0] for nid in by_id}
    for fam, rows in table.items():
        for test_id, reason in rows.items():
            item = by_id.get(test_id)
            if item is None:
                if test_id.split("::")[0] in files and not (config.option.keyword or config.option.markexpr):
                    raise pytest.UsageError(f"tests/expected_failures.toml [{fam}]: no test {test_id!r}")
                continue
            if _family_of(item) != fam:
                raise pytest.UsageError(f"tests/expected_failures.toml [{fam}]: {test_id!r} is not a "
                                        f"{fam} case (its family parameter is {_family_of(item)!r})")
            item.add_marker(pytest.mark.xfail(reason=f"{fam}: {reason}", strict=True))
