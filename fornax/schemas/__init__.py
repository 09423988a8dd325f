"""The JSON Schemas of every document a ``fornax ... --json`` command prints.

Each document names its schema in its ``schema`` key (``fornax.report/1``,
``fornax.compare/1``, ...): the kind before the slash, the major version after
it.  The schema of kind ``K`` ships as ``fornax/schemas/K.schema.json`` (JSON
Schema draft 2020-12); a version bump that removes or retypes a key changes the
number, adding a key does not.  :func:`validate` checks a document against the
schema it names::

    from fornax.schemas import validate
    validate(json.loads(output))        # raises SchemaError naming the first mismatch
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from ..layers.errors import FornaxError


class SchemaError(FornaxError):
    """A document does not match its schema (or names none fornax ships)."""

    kind = "schema"


#: schemas of input files rather than of ``--json`` documents (they carry no ``schema`` key)
INPUT_SCHEMAS = frozenset({"vendor-facts"})


def kinds() -> list[str]:
    """The document kinds with a shipped schema."""
    return sorted(k for k in (p.name.removesuffix(".schema.json")
                              for p in resources.files(__package__).iterdir()
                              if p.name.endswith(".schema.json")) if k not in INPUT_SCHEMAS)


@functools.lru_cache(maxsize=None)
def load(kind: str) -> dict:
    """The JSON Schema of document kind ``kind`` (``report``, ``compare``, ...)."""
    path = resources.files(__package__) / f"{kind}.schema.json"
    if not path.is_file() or not kind.replace("-", "").isalnum():
        raise SchemaError(f"no schema for document kind {kind!r}; shipped: {', '.join(kinds())}")
    return json.loads(path.read_text(encoding="utf-8"))


def validate(doc: dict) -> None:
    """Check ``doc`` against the schema its ``schema`` key names (``KIND/VERSION``)."""
    import jsonschema

    sid = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(sid, str) or "/" not in sid or not sid.startswith("fornax."):
        raise SchemaError(f"the document names no fornax schema (schema = {sid!r})")
    kind, _, version = sid.removeprefix("fornax.").partition("/")
    schema = load(kind)
    want = schema.get("properties", {}).get("schema", {}).get("const")
    if want != sid:
        raise SchemaError(f"document schema {sid!r} is not the shipped {want!r}",
                          hint="regenerate the document with this fornax version")
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise SchemaError(f"{sid}: at {where}: {e.message}"
                          + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
