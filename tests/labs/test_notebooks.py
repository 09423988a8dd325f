"""Every lab as a Jupyter notebook (the ``labs`` extra), generated from the lab's source and
executed with nbclient: it runs the experiments and shows the same sections as the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from fornax import labs

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from fornax.labs.notebook import notebook  # noqa: E402  (after the extra is known to be there)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("number", sorted(labs.LABS))
def test_each_lab_notebook_runs(number, tmp_path, monkeypatch):
    lab = labs.get(number)
    nb = notebook(lab)
    nbformat.validate(nb)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    # the same headings as the page, numbered in order, and every picture written
    page = (ROOT / "docs" / "labs" / f"{lab.slug}.md").read_text(encoding="utf-8")
    headings = [line for line in page.splitlines() if line.startswith("## ") and ". " in line]
    assert headings and all(h in shown for h in headings)
    assert any((tmp_path / f"lab-{number}-output").iterdir())
    assert all(ex.id in nb.cells[-1].source for ex in lab.exercises)
