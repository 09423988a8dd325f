"""The family fixture's capability tags and the per-family expected-failure tables."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from families import CAPABILITIES, FAMILY_OBJECTS, capabilities

ROOT = Path(__file__).resolve().parents[1]

#: what VENDORS.md says of the three real stacks, written independently of the facts files
REAL = {
    "cuda-like": {"peer-access-explicit", "managed-migration", "thread-current-context", "graph-capture",
                  "legacy-default-stream", "per-thread-default-stream", "free-blocks", "event-timing-flag"},
    "rocm-like": {"peer-access-explicit", "managed-migration", "device-current-context", "packet-queues",
                  "graph-capture", "legacy-default-stream", "per-thread-default-stream", "malloc-blocks",
                  "free-blocks", "event-timing-flag"},
    "xpu-like": {"peer-access-query", "managed-migration", "explicit-context", "graph-capture",
                 "out-of-order-queues"},
}


def test_each_family_declares_the_capabilities_of_its_real_stack(family):
    assert set(family.caps) == REAL[family.name]
    assert family.caps <= set(CAPABILITIES)


def test_capabilities_come_from_the_facts_alone():
    facts = {"driver": {"peer": {"rule": "query"}, "contexts": {"current": "explicit"}},
             "runtime": {"out_of_order": True, "blocking": ["malloc"], "graph": {"supported": False}}}
    assert capabilities(facts) == {"peer-access-query", "explicit-context", "out-of-order-queues",
                                   "malloc-blocks"}
    assert capabilities({}) == frozenset()
    with pytest.raises(KeyError, match="unknown capability tag"):
        FAMILY_OBJECTS[0].has("teleportation")


def _run_with_table(tmp_path, table: str, test_id: str):
    path = tmp_path / "xfail.toml"
    path.write_text(table)
    env = {**os.environ, "FORNAX_EXPECTED_FAILURES": str(path)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_id],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


TARGET = "tests/vendors/test_runtime_semantics.py::test_blocking_stream_waits_for_prior_default_stream_work_only_where_it_is_legacy"


def test_a_listed_test_that_passes_fails_the_suite(tmp_path):
    p = _run_with_table(tmp_path, f'[rocm-like]\n"{TARGET}[rocm-like]" = "listed to check the table"\n',
                        TARGET)
    assert p.returncode == 1, p.stdout[-2000:]
    assert "XPASS(strict)" in p.stdout and "rocm-like: listed to check the table" in p.stdout


def test_a_table_entry_naming_no_test_is_an_error(tmp_path):
    p = _run_with_table(tmp_path, f'[xpu-like]\n"{TARGET}_gone[xpu-like]" = "stale"\n', TARGET)
    assert p.returncode != 0 and "no test" in (p.stdout + p.stderr), p.stdout[-2000:] + p.stderr[-2000:]


def test_an_entry_needs_a_reason(tmp_path):
    p = _run_with_table(tmp_path, f'[xpu-like]\n"{TARGET}[xpu-like]" = ""\n', TARGET)
    assert p.returncode != 0 and "needs a reason" in (p.stdout + p.stderr)
