"""docs/new-vendor.md, followed literally: the null template copied into a plugin package,
named in its vendor.toml, registered through the ``fornax.vendors`` entry-point group as
``pip install`` would (a dist-info on the path); the driver suite fails every clause naming
the first hook; with guide.md's my-like seams in place of the template's files, the driver and
runtime suites pass and a workload runs, under the new name."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import fornax.vendors.null as null_template

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "new-vendor.md").read_text(encoding="utf-8")
GUIDE = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")


def _block_after(text: str, label: str, lang: str) -> str:
    m = re.compile(r"^```" + lang + r"\n(.*?)^```", re.S | re.M).search(text, text.index(label))
    assert m is not None, label
    return m.group(1)


def _shown(label: str) -> list[tuple[str, list[str]]]:
    """(command, lines it shows, '...' dropped) of the console block after ``label``."""
    body = _block_after(PAGE, label, "")
    return [(cmd, [ln for ln in out.splitlines() if ln != "..."])
            for cmd, out in re.findall(r"^\$ (fornax [^\n]*)\n(.*?)(?=^\$ |\Z)", body, re.S | re.M)]


def _fornax(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp), "FORNAX_CACHE_DIR": "off", "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "fornax.cli", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=600)


def _matches(shown: list[str], got: list[str]) -> None:
    """Every shown line appears in the output, in order (the page elides the rest with ...)."""
    it = iter(got)
    for line in shown:
        assert any(g.rstrip() == line.rstrip() for g in it), f"the page shows {line!r}; got:\n" + "\n".join(got)


def test_a_family_from_the_null_template_following_the_page(tmp_path):
    # 1. copy the template
    pkg = tmp_path / "acme_fornax"
    shutil.copytree(Path(null_template.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    # 2. name the family in its vendor.toml
    naming = tomllib.loads(_block_after(PAGE, "2. Name the family", "toml"))
    toml = (pkg / "vendor.toml").read_text()
    toml = re.sub(r'^name = ".*"$', f'name = "{naming["name"]}"', toml, count=1, flags=re.M)
    toml = re.sub(r'^description = ".*"$', f'description = "{naming["description"]}"', toml, count=1, flags=re.M)
    (pkg / "vendor.toml").write_text(toml)
    # 3. register it as an installed distribution would
    project = tomllib.loads(_block_after(PAGE, "3. Register it", "toml"))
    info = tmp_path / "acme_fornax-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['project']['name']}\nVersion: 0.1\n")
    eps = project["project"]["entry-points"]["fornax.vendors"]
    (info / "entry_points.txt").write_text("[fornax.vendors]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    # 4. the driver suite fails every clause, each naming a hook, under the new name
    (cmd, shown), = _shown("4. Run the driver suite")
    p = _fornax(tmp_path, *cmd.split()[1:])
    assert p.returncode == 1, p.stderr[-2000:]
    _matches(shown, p.stdout.splitlines())
    doc = json.loads(_fornax(tmp_path, *cmd.split()[1:], "--json").stdout)
    assert doc["passed"] == 0 and doc["failed"] == len(doc["clauses"]) > 0
    for clause in doc["clauses"]:
        assert "[driver/acme-like]" in clause["detail"] and "not implemented: driver." in clause["detail"]
    # 5. guide.md's my-like seams (its facts under the new name, its __init__.py) replace the
    #    template's files; the suites pass and a workload runs
    facts = _block_after(GUIDE, "`my_fornax_vendor/vendor.toml`", "toml")
    (pkg / "vendor.toml").write_text(re.sub(r'^name = ".*"$', f'name = "{naming["name"]}"', facts, count=1,
                                            flags=re.M))     # the family's name: the first key
    (pkg / "__init__.py").write_text(_block_after(GUIDE, "`my_fornax_vendor/__init__.py`:", "python"))
    for cmd, shown in _shown("5. Implement the hooks"):
        p = _fornax(tmp_path, *cmd.split()[1:])
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
        _matches(shown, p.stdout.splitlines())
    p = _fornax(tmp_path, "compose", "--vendor", "acme-like", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    rep = json.loads(p.stdout)
    assert set(rep["manifest"]["stack"].values()) == {"acme-like"}
    assert rep["numerics"] and all(n["ok"] for n in rep["numerics"]) and rep["errors"] == []
