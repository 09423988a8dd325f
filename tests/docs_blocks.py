"""What tests/test_docs_run.py and tests/test_docs_pages.py share: the pages, their fenced
blocks, and the scratch folder a reader's commands run in."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"(?P<marker><!-- docs-test: skip -- (?P<reason>.*?) -->\n)?^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```",
                   re.S | re.M)


def blocks(lang: str):
    """(page, body, skip reason) of every ``lang`` block of every page."""
    for page in PAGES:
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            if m["lang"] == lang:
                yield page, m["body"], m["reason"]


def make_scratch(tmp_path, monkeypatch):
    """A folder with the files the pages name; fornax on PATH as the venv's."""
    toml = next(body for page, body, _ in blocks("toml") if page.name == "guide.md" and "[stack]" in body)
    for name in ("stack.toml", "a.toml", "b.toml", "mystack.toml"):
        (tmp_path / name).write_text(toml)
    (tmp_path / "b.toml").write_text(toml.replace('vendor = "cuda-like"', 'vendor = "xpu-like"'))
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "fornax").symlink_to(Path(sys.executable).parent / "fornax")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


#: a float in scientific notation (what depends on the host's BLAS in shown output)
FLOAT = re.compile(r"-?\d+\.\d+e[-+]\d+")


def same_output(got: str, shown: str, roundoff: float = 0.0) -> bool:
    """Whether ``got`` is the output a page shows: the same lines, floats in scientific
    notation equal to 1e-6 relative.  ``roundoff``: floats both at most this large in
    magnitude are taken as equal (an error figure at round-off level against a CPU result
    depends on the host's BLAS kernels, which differ from one processor to another)."""
    g, s = got.rstrip("\n").splitlines(), shown.rstrip("\n").splitlines()
    if len(g) != len(s):
        return False
    for a, b in zip(g, s):
        if FLOAT.sub("<f>", a) != FLOAT.sub("<f>", b):
            return False
        for x, y in zip(FLOAT.findall(a), FLOAT.findall(b)):
            fx, fy = float(x), float(y)
            if max(abs(fx), abs(fy)) <= roundoff:
                continue
            if abs(fx - fy) > 1e-6 * max(abs(fy), 1e-30):
                return False
    return True


def shown_after(page: Path, marker: str) -> str:
    """The body of the first plain fenced block after ``marker`` on ``page``."""
    text = page.read_text(encoding="utf-8")
    start = text.index("```\n", text.index(marker)) + 4
    return text[start:text.index("```\n", start)]

