"""Reading a vendor family's facts: its ``vendor.toml``, parsed and checked against the shipped
schema (``fornax/schemas/vendor-facts.schema.json``), so a missing or mistyped fact is one line
naming the file, the table and the key, never a KeyError deep inside a seam.

Every family's ``facts.py`` calls :func:`load_facts` once; a third-party family does the same
(``from fornax.vendors import load_facts``).
"""

from __future__ import annotations

import tomllib
from importlib import resources
from typing import Any

from ..layers.errors import ConfigError
from ..schemas import load


def load_facts(package: str) -> dict[str, Any]:
    """Read ``vendor.toml`` from a vendor package and check it against the shipped schema
    (``fornax/schemas/vendor-facts.schema.json``): a missing or mistyped fact is one line
    naming the file, the table and the key, not a KeyError deep inside a seam."""
    try:
        text = (resources.files(package) / "vendor.toml").read_text()
        facts = tomllib.loads(text)
    except (FileNotFoundError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"vendor package {package} has no readable vendor.toml: {exc}") from None
    check_facts(facts, f"{package}/vendor.toml")
    return facts


def check_facts(facts: dict[str, Any], where: str = "vendor.toml") -> None:
    """Raise a ConfigError naming ``where``, the table and the key if ``facts`` break the schema."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load("vendor-facts"))
    errors = sorted(validator.iter_errors(facts), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    e = errors[0]
    path = [str(p) for p in e.absolute_path]
    if e.validator == "required":
        missing = next((k for k in e.validator_value if k not in e.instance), "?")
        table = ".".join(path)
        what = f"[{table}] is missing the key {missing!r}" if table else f"the key {missing!r} is missing"
    elif e.validator == "dependentRequired":
        what = "; ".join(f"a [{k}] table needs the [{', '.join(v)}] table(s)"
                         for k, v in e.validator_value.items() if k in e.instance)
    elif e.validator == "not":
        what = f"[{'.'.join(path[:-1])}] {path[-1]} does not belong here"
    elif path:
        what = f"[{'.'.join(path[:-1])}] {path[-1]}: {e.message}" if len(path) > 1 else \
            f"{path[0]}: {e.message}"
    else:
        what = e.message
    raise ConfigError(f"{where}: {what}", hint="docs/new-vendor.md lists the facts each seam reads")
