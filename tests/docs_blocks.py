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
