"""Where a composed stack crosses from one vendor family into another, and what the real
ecosystem calls that crossing.

Each seam boundary of a stack joins an upper seam to a lower one (framework over runtime,
runtime over driver, compiler output into the driver, library kernels into the driver).  When
the two come from different families, the crossing is carried by a *path*: the compiler's own
cross-target output or a translator at module load (:mod:`fornax.layers.translate`), a
marshalling library (:mod:`fornax.layers.marshal`), or, for a runtime or a framework face, the
layer the upper family declares for the lower one::

    [[portability.runtime]]           # drivers of other families this runtime sits on
    driver = "cuda-like"
    real_name = "HIP on NVIDIA: the HIP runtime is a thin layer over CUDA"

    [[portability.framework]]         # runtimes of other families this face presents
    runtime = "rocm-like"
    real_name = "ROCm PyTorch: torch.cuda over the HIP runtime"

A runtime entry with ``mechanism = "port"`` is a source migration (the family's runtime calls
rewritten to the lower family's, as HIPIFY does): it is taken only when ``--path`` names it
or nothing else is declared.  Several entries may name one lower family; the first default
one carries the crossing unless ``--path NAME`` picks another.

A crossing nobody declares still runs, through fornax's own adapter, and is labelled as
having no real-world counterpart.  Every report lists the crossings (:class:`Crossing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: what a path's cost figures may rest on (the ``basis`` key of a declared path)
BASES = ("vendor figure", "published measurement", "modelling assumption")

#: the label of a crossing no family declares
GENERIC = "generic adapter"
GENERIC_NAME = "none: fornax's own adapter, no real-world counterpart"


@dataclass(frozen=True)
class Crossing:
    """One seam boundary between two families, and the path that carries it."""

    boundary: str         # e.g. "runtime/driver", "compiler/driver", "library/driver"
    upper: str            # the family above the boundary
    lower: str            # the family below it
    mechanism: str        # native, cross-compile, translate, marshal, layer, generic adapter
    name: str             # the path's own name
    real_name: str        # what the real ecosystem calls it
    declared_by: str      # the family whose facts declare it ("fornax" for the generic adapter)
    basis: str = ""       # what its cost figures rest on (vendor figure, published measurement,
                          # modelling assumption); empty when it declares no cost
    alternatives: tuple[str, ...] = ()   # the other paths declared for this boundary
    forced: bool = False  # chosen by --path over the default

    def to_dict(self) -> dict[str, Any]:
        return {"boundary": self.boundary, "upper": self.upper, "lower": self.lower,
                "mechanism": self.mechanism, "name": self.name, "real_name": self.real_name,
                "declared_by": self.declared_by, "basis": self.basis,
                "alternatives": list(self.alternatives), "forced": self.forced}


def declared_basis(t: dict[str, Any], where: str, vendor: str) -> str:
    """The ``basis`` of a declared path (one of :data:`BASES`, or empty when it gives none)."""
    basis = t.get("basis", "")
    if basis and basis not in BASES:
        raise ConfigError(f"{where}: basis must be one of {', '.join(BASES)}, got {basis!r}", vendor=vendor)
    return str(basis)


def declared_tables(raw: Any, vendor: str, table: str, keys: set[str]) -> list[dict[str, Any]]:
    """The entries of the array of tables ``[[table]]`` of ``vendor``'s facts, each a table whose
    keys are among ``keys``; anything else is a one-line ConfigError naming file, table, entry."""
    if not isinstance(raw, list):
        raise ConfigError(f"{vendor} vendor.toml: {table} must be an array of tables "
                          f"([[{table}]])", vendor=vendor)
    for i, t in enumerate(raw):
        where = f"{vendor} vendor.toml: {table}[{i}]"
        if not isinstance(t, dict):
            raise ConfigError(f"{where} is not a table", vendor=vendor)
        unknown = sorted(set(t) - keys)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys: "
                              f"{', '.join(sorted(keys))}", vendor=vendor)
    return raw


#: how a declared runtime or framework layer crosses: implemented over the lower family (the
#: default) or ported to it at source level (taken only when ``--path`` names it)
LAYER_MECHANISMS = ("layer", "port")


def declared_layers(facts: dict[str, Any], vendor: str, table: str, key: str, lower: str,
                    boundary: str) -> list[Crossing]:
    """The ``[[portability.<table>]]`` entries of ``vendor`` whose ``key`` names ``lower``, as
    crossings of ``boundary``, in declaration order."""
    portability = facts.get("portability", {})
    raw = portability.get(table, []) if isinstance(portability, dict) else []
    out = []
    for i, t in enumerate(declared_tables(raw, vendor, f"portability.{table}",
                                          {key, "name", "real_name", "mechanism"})):
        where = f"{vendor} vendor.toml: portability.{table}[{i}]"
        if not isinstance(t.get(key), str):
            raise ConfigError(f"{where} needs {key} = a vendor family", vendor=vendor)
        how = t.get("mechanism", "layer")
        if how not in LAYER_MECHANISMS:
            raise ConfigError(f"{where}: mechanism must be one of {', '.join(LAYER_MECHANISMS)}, "
                              f"got {how!r}", vendor=vendor)
        if t[key] == lower:
            out.append(Crossing(boundary, vendor, lower, how, str(t.get("name", f"{vendor} over {lower}")),
                                str(t.get("real_name", "")), vendor))
    return out


def generic(boundary: str, upper: str, lower: str) -> Crossing:
    """A crossing no family declares: fornax's adapter, labelled as such."""
    return Crossing(boundary, upper, lower, GENERIC, f"fornax {upper} over {lower}", GENERIC_NAME, "fornax")
