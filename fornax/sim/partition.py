"""Device partitions: the ways one chip splits into several devices, as its spec declares them.

A chip spec's ``[partitions]`` table names the chip's partition *modes*.  Each mode
lists its *profiles* (the shape of one partition: compute units, shares of memory
capacity, memory bandwidth and L2, copy engines, media engines) and says how a
layout is chosen:

- ``choose = "profiles"``: the user lists the partitions by profile (GPU instances of
  an MIG-like chip: ``3g.40gb,4g.40gb``, ``1g.10gb:7``), within the mode's budget of
  compute and memory slices and each profile's largest instance count;
- ``choose = "mode"``: the mode fixes the layout (``instances`` partitions of its one
  profile: an MI300X-like chip's ``cpx``, a two-stack chip's ``flat``), optionally with a
  memory mode from the mode's ``memory`` list (``cpx/nps4``).

Each mode also says what a fault in one partition does to the others (``faults``: per
fault kind, ``partition`` or ``device``; ``uncontained``: where an error the hardware
could not contain lands) and whether partitions reach each other's memory over a fabric
(``peer``).  :mod:`fornax.sim.layout` splits a chip by one of its modes, each partition
a device of its own with its share of the chip; :class:`~fornax.sim.chip.Chip` keeps
the fault domain the partitions share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .faults import FAULT_KINDS, SpecError

#: where a fault lands: in the partition it hit, or on every partition of the chip
SCOPES = ("partition", "device")
#: the fault kinds a mode must place (a corrected error stops nothing, so it has no scope)
SCOPED_FAULTS = tuple(k for k in FAULT_KINDS if k != "ecc_correctable")
CHOICES = ("profiles", "mode")

_TABLE_KEYS = {"source", "modes", "memory"}
_MODE_KEYS = {"choose", "label", "description", "profiles", "compute_slices", "memory_slices",
              "instances", "memory", "peer", "faults", "uncontained", "sub_devices", "source"}
_PROFILE_KEYS = {"compute_units", "compute_slices", "memory_slices", "memory", "bandwidth", "l2",
                 "copy_engines", "max_instances", "media"}
_MEMORY_KEYS = {"domains", "description"}


@dataclass(frozen=True)
class Profile:
    """The shape of one partition: its compute units and its shares of the chip."""

    name: str
    compute_units: int
    memory: float                 # fraction of HBM capacity
    bandwidth: float              # fraction of HBM bandwidth
    l2: float                     # fraction of the last-level cache (size and bandwidth)
    copy_engines: int
    max_instances: int
    compute_slices: int = 1       # slices of the mode's compute budget it takes
    memory_slices: int = 1        # slices of the mode's memory budget it takes
    media: dict[str, int] | None = None   # engines by kind; None: the chip's, by compute share


@dataclass(frozen=True)
class MemoryMode:
    """A memory partition mode (NPS-like): HBM split into ``domains`` NUMA domains."""

    name: str
    domains: int
    description: str = ""


@dataclass(frozen=True)
class Mode:
    """One way the chip splits (see the module docstring)."""

    name: str
    choose: str
    label: str                    # how the family names one partition ("MIG", "partition", "stack")
    description: str
    profiles: dict[str, Profile]
    faults: dict[str, str]
    uncontained: str
    peer: bool
    compute_slices: int = 0
    memory_slices: int = 0
    instances: int = 0
    memory: tuple[str, ...] = ()  # memory modes it pairs with, the default first
    sub_devices: int = 0          # sub-devices each partition exposes (a composite device's stacks)
    source: str = ""

    def scope(self, kind: str, contained: bool = True) -> str:
        """Where a fault of ``kind`` lands: ``partition`` or ``device``."""
        if not contained:
            return self.uncontained
        return self.faults.get(kind, "partition")


@dataclass(frozen=True)
class PartitionTable:
    """A chip's ``[partitions]`` table, checked."""

    modes: dict[str, Mode]
    memory: dict[str, MemoryMode] = field(default_factory=dict)
    source: str = ""

    def profile_mode(self, profile: str) -> Mode | None:
        """The ``choose = "profiles"`` mode that has profile ``profile``."""
        return next((m for m in self.modes.values()
                     if m.choose == "profiles" and profile in m.profiles), None)

    def choices(self) -> str:
        """Every layout name this chip takes, for error messages."""
        out = []
        for m in self.modes.values():
            if m.choose == "mode":
                out.append(m.name + "".join(f", {m.name}/{mm}" for mm in m.memory[1:]))
            else:
                out.append(f"{m.name} profiles {', '.join(m.profiles)}")
        return "; ".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source,
                "modes": {n: {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, tuple) else v)
                              for k, v in dataclasses.asdict(m).items()} for n, m in self.modes.items()},
                "memory": {n: dataclasses.asdict(mm) for n, mm in self.memory.items()}}

    def __str__(self) -> str:
        return "; ".join(f"{m.name} ({', '.join(m.profiles)})" for m in self.modes.values())


# ---- parsing -------------------------------------------------------------------------------------
def _bad(where: str, message: str) -> SpecError:
    return SpecError(f"chip spec {where}: [partitions] {message}")


def _keys(table: Any, allowed: set[str] | None, where: str, what: str) -> dict[str, Any]:
    """``table`` if it is a table whose keys are all in ``allowed`` (None: any key)."""
    if not isinstance(table, dict):
        raise _bad(where, f"{what} must be a table, got {table!r}")
    unknown = sorted(set(table) - allowed) if allowed is not None else []
    if unknown and allowed is not None:
        raise _bad(where, f"{what} has unknown key(s) {', '.join(unknown)}; it takes "
                          f"{', '.join(sorted(allowed))}")
    return table


def _count(value: Any, where: str, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(where, f"{what} must be a whole number >= {minimum}, got {value!r}")
    return value


def _share(value: Any, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise _bad(where, f"{what} is a fraction of the chip in (0, 1], got {value!r}")
    return float(value)


def _profile(name: str, data: Any, where: str, units: int, copy_engines: int,
             media_kinds: tuple[str, ...]) -> Profile:
    what = f"profile {name!r}"
    d = _keys(data, _PROFILE_KEYS, where, what)
    missing = sorted({"compute_units", "memory", "copy_engines", "max_instances"} - set(d))
    if missing:
        raise _bad(where, f"{what} is missing {', '.join(missing)}")
    cu = _count(d["compute_units"], where, f"{what} compute_units")
    if cu > units:
        raise _bad(where, f"{what} has {cu} compute units, more than the chip's {units}")
    ce = _count(d["copy_engines"], where, f"{what} copy_engines")
    if ce > copy_engines:
        raise _bad(where, f"{what} has {ce} copy engines, more than the chip's {copy_engines}")
    memory = _share(d["memory"], where, f"{what} memory")
    media = d.get("media")
    if media is not None:
        media = _keys(media, set(media_kinds), where, f"{what} media (engine kinds of the chip's [media])")
        media = {k: _count(v, where, f"{what} media.{k}", 0) for k, v in media.items()}
    return Profile(name, cu, memory, _share(d.get("bandwidth", memory), where, f"{what} bandwidth"),
                   _share(d.get("l2", memory), where, f"{what} l2"), ce,
                   _count(d["max_instances"], where, f"{what} max_instances"),
                   _count(d.get("compute_slices", 1), where, f"{what} compute_slices"),
                   _count(d.get("memory_slices", 1), where, f"{what} memory_slices"), media)


def _mode(name: str, data: Any, where: str, spec: dict[str, Any], memory: dict[str, MemoryMode]) -> Mode:
    what = f"mode {name!r}"
    d = _keys(data, _MODE_KEYS, where, what)
    choose = d.get("choose")
    if choose not in CHOICES:
        raise _bad(where, f"{what}: choose must be one of {', '.join(CHOICES)}, got {choose!r}")
    media = spec.get("media")
    kinds = tuple(e.kind for e in media.engines) if media is not None else ()
    profiles = {p: _profile(p, v, where, spec["compute_units"], spec["copy_engines"], kinds)
                for p, v in _keys(d.get("profiles"), None, where, f"{what} profiles").items()}
    if not profiles:
        raise _bad(where, f"{what} declares no profiles")
    faults = _keys(d.get("faults"), set(SCOPED_FAULTS), where, f"{what} faults (fault kinds)")
    missing = [k for k in SCOPED_FAULTS if k not in faults]
    if missing:
        raise _bad(where, f"{what} faults must place every fault kind; missing {', '.join(missing)}")
    for k, v in [*faults.items(), ("uncontained", d.get("uncontained"))]:
        if v not in SCOPES:
            raise _bad(where, f"{what} faults.{k} must be one of {', '.join(SCOPES)}, got {v!r}")
    if not isinstance(d.get("peer"), bool):
        raise _bad(where, f"{what} peer must be true or false (partitions reach each other's memory)")
    for key in ("label", "description"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise _bad(where, f"{what} {key} must be a non-empty string")
    mems = d.get("memory", [])
    if not isinstance(mems, list) or any(not isinstance(m, str) or m not in memory for m in mems):
        raise _bad(where, f"{what} memory must list memory modes of [partitions.memory] "
                          f"({', '.join(memory) or 'none declared'}), got {mems!r}")
    mode = Mode(name, choose, d["label"], d["description"], profiles, dict(faults), d["uncontained"],
                d["peer"], memory=tuple(mems), sub_devices=_count(d.get("sub_devices", 0), where,
                                                                   f"{what} sub_devices", 0),
                source=str(d.get("source", "")))
    if choose == "profiles":
        return dataclasses.replace(
            mode, compute_slices=_count(d.get("compute_slices"), where, f"{what} compute_slices"),
            memory_slices=_count(d.get("memory_slices"), where, f"{what} memory_slices"))
    if len(profiles) != 1:
        raise _bad(where, f"{what} fixes its layout, so it has exactly one profile, got {', '.join(profiles)}")
    instances = _count(d.get("instances"), where, f"{what} instances")
    only = next(iter(profiles.values()))
    if instances > only.max_instances:
        raise _bad(where, f"{what} has {instances} instances; its profile allows {only.max_instances}")
    if instances * only.compute_units > spec["compute_units"] or instances * only.memory > 1:
        raise _bad(where, f"{what}: {instances} x {only.name} ({only.compute_units} units, memory "
                          f"{only.memory:g}) is more than the chip ({spec['compute_units']} units, memory 1)")
    return dataclasses.replace(mode, instances=instances)


def parse_partitions(data: Any, where: str, spec: dict[str, Any]) -> PartitionTable:
    """The ``[partitions]`` table of chip spec ``where``, checked against the spec's other
    fields (``spec``: compute units, copy engines, media)."""
    d = _keys(data, _TABLE_KEYS, where, "the table")
    memory = {n: MemoryMode(n, _count(_keys(v, _MEMORY_KEYS, where, f"memory mode {n!r}").get("domains"),
                                      where, f"memory mode {n!r} domains"), str(v.get("description", "")))
              for n, v in _keys(d.get("memory", {}), None, where, "memory").items()}
    modes = {n: _mode(n, v, where, spec, memory)
             for n, v in _keys(d.get("modes"), None, where, "modes").items()}
    if not modes:
        raise _bad(where, "declares no modes")
    names = [p for m in modes.values() for p in m.profiles if m.choose == "profiles"]
    clash = sorted((set(names) & set(modes)) | {p for p in names if names.count(p) > 1})
    if clash:
        raise _bad(where, f"profile name(s) {', '.join(clash)} are not unique across modes")
    return PartitionTable(modes, memory, str(d.get("source", "")))
