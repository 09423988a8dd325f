"""The documentation's Python is executed: every page's ``python`` blocks run in order in one
fresh interpreter (a block followed by ``Output:`` must print what it shows), and the guide's
third-party vendor is built from its own blocks and composed.  The commands of the ``sh``
blocks run in tests/test_docs_run.py, whose helpers (pages, fences, the scratch folder)
this file shares."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from docs_blocks import FENCE, PAGES, ROOT, make_scratch, same_output


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    return make_scratch(tmp_path, monkeypatch)

SEPARATOR = "--- docs-test: next block ---"


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
            assert same_output(printed, shown), f"{page.name}: the block's output changed; now:\n{printed}"


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
    # the coverage sentence: a graph using tanh falls back with the reason the guide quotes
    quoted = re.search(r"a graph using `tanh` reports\n`(\{.*?\})`", guide, re.S)[1]
    probe = (
        "import numpy as np\n"
        "from fornax.layers.graph import DType, Graph\n"
        "from fornax.stack import compose, make_config\n"
        "g = Graph('t'); x = g.input('x', (4, 8), DType.FLOAT32)\n"
        "g.output(g.op('add', g.op('tanh', g.op('relu', x)), x))\n"
        "r = compose(make_config('my-like')).run(g, {'x': np.ones((4, 8), np.float32)})\n"
        "print(r.fallbacks)\n")
    p = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == f"[{quoted}]", p.stdout
