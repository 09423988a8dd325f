"""Chip specs: the hardware model's parameters, loaded from TOML data.

Each shipped spec lives in ``specs/NAME.toml`` and cites where its figures
came from.  A spec names figures only; it holds no vendor logic.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from . import tomlfile
from .faults import SpecError
from .media import MediaSpec, parse_media
from .partition import PartitionTable, parse_partitions

#: field name -> (type, description).  Every field is required.
_FIELDS: dict[str, tuple[type[Any], str]] = {
    "name": (str, "spec name"),
    "description": (str, "what the spec models"),
    "compute_units": (int, "SMs / CUs / Xe cores"),
    "simd_width": (int, "hardware SIMD group width (lanes)"),
    "clock_ghz": (float, "sustained compute clock"),
    "hbm_bytes": (int, "device memory capacity in bytes"),
    "hbm_bandwidth": (float, "device memory bandwidth in bytes/s"),
    "l2_bytes": (int, "last-level cache size in bytes"),
    "l2_bandwidth": (float, "last-level cache bandwidth in bytes/s"),
    "registers_per_unit": (int, "32-bit registers per compute unit"),
    "shared_memory_per_unit": (int, "on-chip shared memory per compute unit in bytes"),
    "host_link_bandwidth": (float, "host link bandwidth per direction in bytes/s"),
    "peer_link_bandwidth": (float, "peer (device-to-device) bandwidth per direction per device in bytes/s"),
    "peer_link_latency_s": (float, "latency of one peer transfer in seconds"),
    "nic_bandwidth": (float, "scale-out network bandwidth per device per direction in bytes/s (one "
                             "NIC per device, as GPU nodes have: the inter-node tier)"),
    "nic_latency_s": (float, "latency of one transfer between nodes in seconds"),
    "copy_engines": (int, "number of copy (DMA) engines"),
    "launch_latency_s": (float, "kernel launch latency in seconds"),
    "memory_latency_s": (float, "load-to-use latency of one HBM access in seconds"),
    "copy_latency_s": (float, "fixed cost of one DMA copy in seconds"),
    "page_size": (int, "MMU page size in bytes"),
    "max_group_size": (int, "largest work-group / block in lanes"),
    "max_grid": (list, "largest grid per dimension [x, y, z]"),
    "matrix_shape": (list, "matrix instruction shape [m, n, k]"),
    "matrix_efficiency": (float, "fraction of matrix peak a well-tuned kernel reaches"),
    "memory_efficiency": (float, "fraction of HBM bandwidth a streaming kernel reaches"),
    "board_power_w": (float, "board power limit in watts"),
    "matrix_peak": (dict, "dense matrix-unit peak FLOP/s per dtype"),
    "vector_peak": (dict, "vector-unit peak FLOP/s per dtype"),
    "power": (dict, "power and thermal model constants (see POWER_FIELDS)"),
}

#: optional fields: name -> (type, description); a spec that leaves one out gets the default
#: :class:`ChipSpec` gives it (which reproduces the model without that refinement)
OPTIONAL_FIELDS: dict[str, tuple[type[Any], str]] = {
    "matrix_efficiency_by_dtype": (dict, "fraction of matrix peak a well-tuned kernel reaches, per "
                                         "dtype, where measurements show it differs from "
                                         "matrix_efficiency (the default for every dtype not listed); "
                                         "each key must be a matrix_peak dtype"),
    "peer_link_efficiency": (float, "fraction of peer_link_bandwidth a transfer achieves on each "
                                    "link (link protocol and error-correction overhead); default 1"),
    "media": (dict, "fixed-function video decode engines by kind (fornax.sim.media); default none"),
    "sparse_matrix_peak": (dict, "2:4 structured-sparse matrix-instruction peak FLOP/s per dtype, "
                                 "counted as dense-equivalent work (the datasheet's 'with "
                                 "sparsity' figure); each key must be a matrix_peak dtype and its "
                                 "rate at least the dense one; default none: the chip has no "
                                 "sparse matrix instruction"),
    "partitions": (dict, "the chip's partition modes (MIG-like instances, compute/memory partition "
                         "modes, stacks as devices: fornax.sim.partition); default none"),
}

#: the [power] table: energy per unit of work, static power and a thermal RC model
POWER_FIELDS: dict[str, str] = {
    "static_w": "idle/static board power in watts",
    "matrix_pj_per_flop": "energy per matrix-unit bfloat16 FLOP in picojoules (other dtypes scale "
                          "with the bfloat16 peak over theirs: the unit draws about the same power "
                          "at full rate in every dtype)",
    "vector_pj_per_flop": "energy per vector-unit float32 FLOP in picojoules (other dtypes scale "
                          "the same way against the float32 vector peak)",
    "hbm_pj_per_byte": "energy per byte moved to or from HBM in picojoules",
    "l2_pj_per_byte": "energy per byte served by L2 in picojoules",
    "thermal_resistance_c_per_w": "junction-to-ambient thermal resistance in degC per watt",
    "thermal_capacitance_j_per_c": "thermal capacitance in joules per degC",
    "ambient_c": "ambient (inlet) temperature in degC",
    "throttle_temp_c": "temperature at which clocks are lowered, degC",
    "min_clock_fraction": "lowest clock as a fraction of the nominal clock",
}


@dataclass(frozen=True)
class ChipSpec:
    name: str
    description: str
    compute_units: int
    simd_width: int
    clock_ghz: float
    hbm_bytes: int
    hbm_bandwidth: float
    l2_bytes: int
    l2_bandwidth: float
    registers_per_unit: int
    shared_memory_per_unit: int
    host_link_bandwidth: float
    peer_link_bandwidth: float
    peer_link_latency_s: float
    nic_bandwidth: float
    nic_latency_s: float
    copy_engines: int
    launch_latency_s: float
    memory_latency_s: float
    copy_latency_s: float
    page_size: int
    max_group_size: int
    max_grid: tuple[int, int, int]
    matrix_shape: tuple[int, int, int]
    matrix_efficiency: float
    memory_efficiency: float
    board_power_w: float
    matrix_peak: dict[str, float] = field(default_factory=dict)
    vector_peak: dict[str, float] = field(default_factory=dict)
    power: dict[str, float] = field(default_factory=dict)
    matrix_efficiency_by_dtype: dict[str, float] = field(default_factory=dict)
    peer_link_efficiency: float = 1.0
    source: str = ""
    #: the video decode engines (the ``[media]`` table); None: the chip has none modelled
    media: MediaSpec | None = None
    #: dtype -> 2:4 sparse matrix-instruction peak (dense-equivalent FLOP/s); empty: none
    sparse_matrix_peak: dict[str, float] = field(default_factory=dict)
    #: the partition modes (the ``[partitions]`` table); None: the chip cannot be partitioned
    partitions: PartitionTable | None = None

    def peak(self, dtype: str, matrix: bool) -> float:
        """Peak FLOP/s for ``dtype`` on the matrix or vector unit (falls back to fp32 vector)."""
        table = self.matrix_peak if matrix else self.vector_peak
        if dtype in table:
            return table[dtype]
        if matrix and dtype in self.vector_peak:
            return self.vector_peak[dtype]
        return self.vector_peak.get("float32", min(self.vector_peak.values()))

    def sparse_peak(self, dtype: str) -> float | None:
        """Peak dense-equivalent FLOP/s of the 2:4 sparse matrix instruction in ``dtype``, or
        None when the chip has no sparse matrix instruction for it."""
        return self.sparse_matrix_peak.get(dtype)

    def matrix_efficiency_for(self, dtype: str) -> float:
        """Fraction of the matrix peak a well-tuned kernel reaches in ``dtype``: its entry in
        ``matrix_efficiency_by_dtype``, else ``matrix_efficiency``."""
        return self.matrix_efficiency_by_dtype.get(dtype, self.matrix_efficiency)

    @property
    def peer_link_achievable(self) -> float:
        """Peer bandwidth per direction per device a transfer achieves, in bytes/s:
        ``peer_link_bandwidth x peer_link_efficiency``."""
        return self.peer_link_bandwidth * self.peer_link_efficiency

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON values (tuples as lists, tables as objects; ``media`` as its
        table, or None)."""
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else \
                v.to_dict() if isinstance(v, (MediaSpec, PartitionTable)) else v
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "compute_units": self.compute_units,
            "simd_width": self.simd_width,
            "hbm_bytes": self.hbm_bytes,
            "hbm_bandwidth": self.hbm_bandwidth,
            "matrix_peak_bfloat16": self.matrix_peak.get("bfloat16"),
            "source": self.source,
        }


def _validate(data: dict[str, Any], where: str) -> ChipSpec:
    missing = [k for k in _FIELDS if k not in data]
    if missing:
        raise SpecError(
            f"chip spec {where} is incomplete: missing field(s) {', '.join(missing)} "
            f"(each spec must define: {', '.join(_FIELDS)})"
        )
    unknown = sorted(set(data) - set(_FIELDS) - set(OPTIONAL_FIELDS) - {"source"})
    if unknown:
        raise SpecError(f"chip spec {where} has unknown field(s): {', '.join(unknown)}")
    values: dict[str, Any] = {}     # each checked against its field's type below
    for key, (typ, desc) in _FIELDS.items():
        value = _typed(where, key, typ, desc, data[key])
        if typ in (int, float) and value <= 0:
            raise SpecError(f"chip spec {where}: field {key!r} ({desc}) must be positive, got {value}")
        values[key] = value
    for key in ("max_grid", "matrix_shape"):
        seq = values[key]
        if len(seq) != 3 or not all(isinstance(v, int) and v > 0 for v in seq):
            raise SpecError(f"chip spec {where}: field {key!r} must be three positive integers, got {seq!r}")
        values[key] = tuple(seq)
    for key in ("matrix_peak", "vector_peak"):
        table = values[key]
        for dt, rate in table.items():
            if not isinstance(rate, (int, float)) or rate <= 0:
                raise SpecError(f"chip spec {where}: {key}.{dt} must be a positive number, got {rate!r}")
        values[key] = {dt: float(rate) for dt, rate in table.items()}
    power = values["power"]
    missing_power = [k for k in POWER_FIELDS if k not in power]
    if missing_power:
        raise SpecError(f"chip spec {where}: [power] is missing field(s) {', '.join(missing_power)}")
    unknown_power = sorted(set(power) - set(POWER_FIELDS))
    if unknown_power:
        raise SpecError(f"chip spec {where}: [power] has unknown field(s) {', '.join(unknown_power)}")
    for key, rate in power.items():
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
            raise SpecError(f"chip spec {where}: power.{key} ({POWER_FIELDS[key]}) must be a positive "
                            f"number, got {rate!r}")
    values["power"] = {k: float(v) for k, v in power.items()}
    if values["power"]["min_clock_fraction"] > 1:
        raise SpecError(f"chip spec {where}: power.min_clock_fraction is a fraction in (0, 1]")
    if "float32" not in values["vector_peak"]:
        raise SpecError(f"chip spec {where}: vector_peak must define float32")
    for key in ("matrix_efficiency", "memory_efficiency"):
        _fraction(where, key, values[key])
    if values["page_size"] & (values["page_size"] - 1):
        raise SpecError(f"chip spec {where}: page_size must be a power of two, got {values['page_size']}")
    values.update(_optional(data, where, values["matrix_peak"]))
    if "partitions" in values:       # checked against the units, copy engines and media above
        values["partitions"] = parse_partitions(values["partitions"], where, values)
    return ChipSpec(**values, source=str(data.get("source", "")))


def _typed(where: str, key: str, typ: type[Any], desc: str, value: Any) -> Any:
    """``value`` of field ``key`` if it has type ``typ`` (an int where a float is due is
    taken as one; a bool is never a number)."""
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise SpecError(
            f"chip spec {where}: field {key!r} ({desc}) must be {typ.__name__}, "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def _fraction(where: str, name: str, value: Any) -> float:
    """``value`` if it is a number in (0, 1]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
        raise SpecError(f"chip spec {where}: {name} is a fraction in (0, 1], got {value!r}")
    return float(value)


def _optional(data: dict[str, Any], where: str, matrix_peak: dict[str, float]) -> dict[str, Any]:
    """The optional fields ``data`` gives, checked (a fraction in (0, 1] each)."""
    out = {key: _typed(where, key, typ, desc, data[key])
           for key, (typ, desc) in OPTIONAL_FIELDS.items() if key in data}
    table = out.get("matrix_efficiency_by_dtype", {})
    for dt in table:
        if dt not in matrix_peak:
            raise SpecError(f"chip spec {where}: matrix_efficiency_by_dtype.{dt} names a dtype the "
                            f"matrix unit has no peak for (matrix_peak: {', '.join(matrix_peak)})")
    if table:
        out["matrix_efficiency_by_dtype"] = {
            dt: _fraction(where, f"matrix_efficiency_by_dtype.{dt}", frac) for dt, frac in table.items()}
    if "peer_link_efficiency" in out:
        _fraction(where, "peer_link_efficiency", out["peer_link_efficiency"])
    if "media" in out:
        out["media"] = parse_media(out["media"], where)
    if "sparse_matrix_peak" in out:
        sparse: dict[str, float] = {}
        for dt, rate in out["sparse_matrix_peak"].items():
            if dt not in matrix_peak:
                raise SpecError(f"chip spec {where}: sparse_matrix_peak.{dt} names a dtype the matrix "
                                f"unit has no dense peak for (matrix_peak: {', '.join(matrix_peak)})")
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate < matrix_peak[dt]:
                raise SpecError(f"chip spec {where}: sparse_matrix_peak.{dt} must be a number of FLOP/s "
                                f"at least the dense matrix_peak.{dt} ({matrix_peak[dt]:g}), got {rate!r}")
            sparse[dt] = float(rate)
        out["sparse_matrix_peak"] = sparse
    return out


def available_specs() -> list[str]:
    """Names of the specs shipped with fornax."""
    folder = resources.files(__package__) / "specs"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_spec(name_or_path: str | Path) -> ChipSpec:
    """Load a shipped spec by name, or a spec file by path."""
    path = Path(name_or_path)
    if isinstance(name_or_path, Path) or str(name_or_path).endswith(".toml"):
        return _validate(tomlfile.read(path, "chip spec file", SpecError), str(path))
    name = str(name_or_path)
    if name not in available_specs():
        raise SpecError(
            f"unknown chip spec {name!r}; shipped specs: {', '.join(available_specs())} "
            "(or give a path to a .toml spec file)"
        )
    text = (resources.files(__package__) / "specs" / f"{name}.toml").read_text(encoding="utf-8")
    where = name
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"chip spec {where} is not valid TOML: {exc}") from None
    return _validate(data, where)
