"""The documentation is executed: every ``python`` block and every command of every ``sh``
block in README.md and docs/ runs here, from a scratch folder, as a reader would run it.

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

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"(?P<marker><!-- docs-test: skip -- (?P<reason>.*?) -->\n)?^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```",
                   re.S | re.M)

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
    "fornax compose --vendor cuda-like --meta --devices 8 --workload llama70b-step":
        "a 70B-parameter step in shape-only mode; tests/test_llm_step.py runs it",
}


#: commands the pages show failing on purpose, and the exit code they must end with
EXPECTED_RC = {
    "fornax conform driver --vendor null": 1,      # the template vendor fails its suite by design
}


def _blocks(lang: str):
    for page in PAGES:
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            if m["lang"] == lang:
                yield page, m["body"], m["reason"]


def _commands():
    for page, body, reason in _blocks("sh"):
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            cmd = line.split("#", 1)[0].strip()
            if cmd:
                yield pytest.param(cmd, reason, id=f"{page.relative_to(ROOT)}: {cmd}")


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder with the files the pages name; fornax on PATH as the venv's."""
    toml = next(body for page, body, _ in _blocks("toml") if page.name == "guide.md" and "[stack]" in body)
    for name in ("stack.toml", "a.toml", "b.toml", "mystack.toml"):
        (tmp_path / name).write_text(toml)
    (tmp_path / "b.toml").write_text(toml.replace('vendor = "cuda-like"', 'vendor = "xpu-like"'))
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "fornax").symlink_to(Path(sys.executable).parent / "fornax")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


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


SEPARATOR = "--- docs-test: next block ---"
FLOAT = re.compile(r"-?\d+\.\d+e[-+]\d+")


def _python_blocks(page: Path) -> list[tuple[str, str | None, str | None]]:
    """(code, skip reason, the output it shows or None) of each python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    matches = list(FENCE.finditer(text))
    blocks = []
    for i, m in enumerate(matches):
        if m["lang"] != "python":
            continue
        shown = None
        nxt = matches[i + 1] if i + 1 < len(matches) else None
        if nxt is not None and nxt["lang"] == "" and text[m.end():nxt.start()].strip() == "Output:":
            shown = nxt["body"]
        blocks.append((m["body"], m["reason"], shown))
    return blocks


def _same_output(got: str, shown: str) -> bool:
    g, s = got.rstrip("\n").splitlines(), shown.rstrip("\n").splitlines()
    if len(g) != len(s):
        return False
    for a, b in zip(g, s):
        if FLOAT.sub("<f>", a) != FLOAT.sub("<f>", b):
            return False
        for x, y in zip(FLOAT.findall(a), FLOAT.findall(b)):
            if abs(float(x) - float(y)) > 1e-6 * max(abs(float(y)), 1e-30):
                return False
    return True


@pytest.mark.parametrize("page", [p for p in PAGES if "```python" in p.read_text(encoding="utf-8")],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_a_page_runs(page, scratch):
    blocks = [b for b in _python_blocks(page) if not b[1]]
    if not blocks:
        pytest.skip("; ".join(reason for _, reason, _ in _python_blocks(page)))
    script = scratch / "docs_page.py"
    script.write_text(f"\nprint({SEPARATOR!r})\n".join(code for code, _, _ in blocks), encoding="utf-8")
    p = subprocess.run([sys.executable, str(script)], cwd=scratch, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, f"{page.name}:\n{p.stderr[-3000:]}"
    for (code, _, shown), printed in zip(blocks, p.stdout.split(SEPARATOR + "\n")):
        if shown is not None:
            assert _same_output(printed, shown), f"{page.name}: the block's output changed; now:\n{printed}"


def _block_after(text: str, label: str, lang: str) -> str:
    m = re.compile(r"^```" + lang + r"\n(.*?)^```", re.S | re.M).search(text, text.index(label))
    return m.group(1)


def test_the_third_party_vendor_walkthrough_composes_as_written(tmp_path):
    """docs/guide.md's plugin, built from its own blocks and registered as ``pip install``
    would (a dist-info with the entry point on the path), composes and says what the guide
    shows."""
    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    pkg = tmp_path / "my_fornax_vendor"
    pkg.mkdir()
    (pkg / "vendor.toml").write_text(_block_after(guide, "`my_fornax_vendor/vendor.toml`", "toml"))
    (pkg / "__init__.py").write_text(_block_after(guide, "`my_fornax_vendor/__init__.py`:", "python"))
    project = tomllib.loads(re.search(r"^```toml\n(# pyproject.toml of the plugin\n.*?)^```", guide, re.S | re.M)[1])
    info = tmp_path / "my_fornax_vendor-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['project']['name']}\nVersion: 0.1\n")
    eps = project["project"]["entry-points"]["fornax.vendors"]
    (info / "entry_points.txt").write_text("[fornax.vendors]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    shown = _block_after(guide, "Installed with `pip install -e .`", "")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FORNAX_CACHE_DIR": "off", "COLUMNS": "80"}
    sessions = re.findall(r"^\$ (fornax [^\n]*)\n(.*?)(?=^\$ |\Z)", shown, re.S | re.M)
    assert len(sessions) == 2
    for cmd, expected in sessions:
        p = subprocess.run([sys.executable, "-m", "fornax.cli", *cmd.split()[1:]], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        got = [line.rstrip() for line in (p.stdout + p.stderr).splitlines()]
        want = [line.rstrip() for line in expected.splitlines() if line != "..."]
        assert got[:len(want)] == want, f"{cmd}: the guide shows\n" + "\n".join(want) + "\nnow:\n" + "\n".join(got[:len(want)])
