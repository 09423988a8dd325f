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


#: test files that run for minutes (subprocess runs of PyTorch's harness): collected first, so
#: the two workers of ``make test`` (``--dist loadfile``) start on them and share the lighter
#: files at the end instead of one worker finishing a long file alone
HEAVY_FIRST = ("tests/pytorch/test_torch_suite_sample_",)


def pytest_collection_modifyitems(session, config, items):
    def heavy(item) -> int:
        path = item.nodeid.replace("\\", "/")
        return 0 if any(path.startswith(p) or f"/{p}" in path for p in HEAVY_FIRST) else 1
    items.sort(key=heavy)            # stable: the order within each part is kept
