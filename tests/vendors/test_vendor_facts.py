"""vendor.toml is checked against its schema when a family loads: a missing or mistyped fact is
one line naming the file, the table and the key."""

from __future__ import annotations

import copy
import tomllib
from importlib import resources

import pytest

from fornax.layers.errors import ConfigError
from fornax.vendors import check_facts, load_facts

from helpers import FAMILIES


def _facts(family: str) -> dict:
    text = (resources.files(f"fornax.vendors.{family.replace('-', '_')}") / "vendor.toml").read_text()
    return tomllib.loads(text)


@pytest.mark.parametrize("family", [*FAMILIES, "null"])
def test_every_shipped_family_meets_the_schema(family):
    check_facts(_facts(family), family)


@pytest.mark.parametrize("break_it, says", [
    (lambda f: f["driver"].pop("simd_width"), "[driver] is missing the key 'simd_width'"),
    (lambda f: f["driver"]["contexts"].__setitem__("current", "global"),
     "[driver.contexts] current: 'global' is not one of"),
    (lambda f: f["compiler"].__setitem__("simd_width", 32), "[compiler] simd_width does not belong here"),
    (lambda f: f.pop("errors"), "a [driver] table needs the [errors] table(s)"),
    (lambda f: f["runtime"]["errors"].pop("codes"), "[runtime.errors] is missing the key 'codes'"),
    (lambda f: f["compiler"].__setitem__("matrix_shape", [16, 8]), "[compiler] matrix_shape"),
    (lambda f: f.__setitem__("name", "Bad Name"), "name: 'Bad Name' does not match"),
])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_broken_fact_is_one_line_naming_table_and_key(family, break_it, says):
    facts = copy.deepcopy(_facts(family))
    break_it(facts)
    with pytest.raises(ConfigError) as info:
        check_facts(facts, f"{family}/vendor.toml")
    msg = info.value.message
    assert msg.startswith(f"{family}/vendor.toml: ") and says in msg and "\n" not in msg, msg


def test_a_package_with_a_broken_vendor_toml_fails_at_load(tmp_path, monkeypatch):
    pkg = tmp_path / "fx_brokenfacts"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    text = (resources.files("fornax.vendors.cuda_like") / "vendor.toml").read_text()
    (pkg / "vendor.toml").write_text(text.replace("simd_width = 32", "simd_width = \"wide\"", 1))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"fx_brokenfacts/vendor.toml: \[driver\] simd_width: 'wide' is not of type 'integer'"):
        load_facts("fx_brokenfacts")
