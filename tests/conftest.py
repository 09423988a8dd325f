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
