"""The documentation is executed: every command of every ``sh`` block in README.md and docs/
runs here, and every ``python`` block in tests/test_docs_pages.py, from a scratch folder, as
a reader would run them.

* A page's ``python`` blocks run in order in one fresh interpreter (a reader pastes them
  one after another), and must end without an error.  A block followed by ``Output:`` and a
  plain block shows what it prints: that must be what it prints now (floats in scientific
  notation, which depend on the host's BLAS, compared to 1e-6 relative).
* Each command line of an ``sh`` block (``fornax``, ``.venv/bin/fornax``, ``python``) runs
  as a process and must exit 0 (or the code of :data:`EXPECTED_RC`, for a command a page
  shows failing on purpose).  The scratch folder holds the files the pages name
  (``stack.toml`` is the guide's own example config).
* What is not run says why: a block preceded by ``<!-- docs-test: skip -- REASON -->``,
  and the commands of :data:`NOT_RUN` (each with its reason).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from docs_blocks import ROOT, blocks, make_scratch


#: command prefixes that are not run here, and why
NOT_RUN = {
    "make": "the make targets wrap the commands run here (make test is this suite itself)",
    "pytest": "the conformance suites under plain pytest are run by tests/contracts",
    "FORNAX_VENDOR=": "the torch suite under plain pytest is run by tests/pytorch",
    "fornax qualify": "a qualification takes minutes; tests/cli/test_qualify.py runs it on every family",
    "python -m fornax.contracts.torch_suite": "the torch suite's runs are tests/pytorch/test_torch_suite_runner.py",
    "fornax conform runtime --impl": "names a third-party package (mypkg) the reader writes",
    "fornax conform driver --impl": "names a third-party package (my_vendor) the reader writes",
    "fornax compare --workload transformer-block": "a long comparison; tests/cli/test_compare.py runs compare",
    "python -m torch.distributed.run --standalone --nproc-per-node 2 -m fornax.scenarios.distributed":
        "tests/torch/test_distributed.py runs this program under torchrun on every family",
    "fornax compose --vendor cuda-like --meta --devices 8 --workload llama70b-step":
        "a 70B-parameter step in shape-only mode; tests/test_llm_step.py runs it",
}


#: commands the pages show failing on purpose, and the exit code they must end with
EXPECTED_RC = {
    "fornax conform driver --vendor null": 1,      # the template vendor fails its suite by design
}


def _commands():
    for page, body, reason in blocks("sh"):
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            cmd = line.split("#", 1)[0].strip()
            if cmd:
                yield pytest.param(cmd, reason, id=f"{page.relative_to(ROOT)}: {cmd}")


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    return make_scratch(tmp_path, monkeypatch)


@pytest.mark.parametrize("cmd, reason", list(_commands()))
def test_every_documented_command_runs(cmd, reason, scratch):
    if reason:
        pytest.skip(reason)
    plain = cmd.removeprefix(".venv/bin/")
    why = next((why for prefix, why in NOT_RUN.items() if plain.startswith(prefix)), None)
    if why:
        pytest.skip(why)
    p = subprocess.run(cmd, shell=True, cwd=scratch, capture_output=True, text=True, timeout=600)
    rc = next((rc for prefix, rc in EXPECTED_RC.items() if plain.startswith(prefix)), 0)
    assert p.returncode == rc, f"{cmd}\n{p.stderr[-2000:]}"
