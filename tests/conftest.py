"""Suite-wide fixtures."""

import os

import pytest


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


def pytest_collection_modifyitems(session, config, items):
    def heavy(item) -> int:
        path = item.nodeid.replace("\\", "/")
        return next((i for i, p in enumerate(HEAVY_FIRST) if path.startswith(p) or f"/{p}" in path),
                    len(HEAVY_FIRST))
    items.sort(key=heavy)            # stable: the order within each part is kept
