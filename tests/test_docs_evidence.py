"""The real-client figures docs/torch.md quotes are the rendering of a recorded `make bench`
run (docs/evidence/real-clients.json), never typed by hand."""

from __future__ import annotations

import json

from benchmarks import real_clients as rc


def _section(text: str) -> str:
    return text[text.index(rc.BEGIN):text.index(rc.END) + len(rc.END)]


def test_the_page_is_the_rendering_of_the_record():
    record = json.loads(rc.RECORD.read_text(encoding="utf-8"))
    assert _section(rc.PAGE.read_text(encoding="utf-8")) == rc.render(record)


def test_the_record_covers_every_family_model_and_program():
    from fornax.scenarios import hf_zoo, jax_zoo
    record = json.loads(rc.RECORD.read_text(encoding="utf-8"))
    assert set(record["suite"]) == set(record["zoo"]) == set(record["jax"]) == set(rc.VENDORS)
    for vendor in rc.VENDORS:
        assert {m["model"] for m in record["zoo"][vendor]} == set(hf_zoo.ZOO)
        assert {p["program"] for p in record["jax"][vendor]} == set(jax_zoo.ZOO)
        assert set(record["suite"][vendor]["kinds"]) == {"ops", "modules", "optims"}


def test_render_reflects_a_failure():
    record = json.loads(rc.RECORD.read_text(encoding="utf-8"))
    vendor = rc.VENDORS[0]
    model = record["zoo"][vendor][0]
    model["modes"]["eager"]["ok"] = False
    ops = record["suite"][vendor]["kinds"]["ops"]["float32"]
    ops["passed"] -= 1
    text = rc.render(record)
    assert f"| {model['model']} | eager ✗" in text
    assert f"{100 * ops['passed'] / ops['run']:.2f} % of {ops['run']}" in text
