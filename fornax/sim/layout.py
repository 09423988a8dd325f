"""Layouts: a chip split by one of its partition modes, each partition a device's spec.

:func:`layout` reads a layout (``3g.40gb,4g.40gb``, ``1g.10gb:7``, ``cpx``, ``cpx/nps4``,
``flat``) against the chip spec's ``[partitions]`` table (:mod:`fornax.sim.partition`)
and checks it (each profile's instance count, the mode's slice budget, the memory modes
a mode pairs with); :func:`derive_spec` gives each partition a
:class:`~fornax.sim.spec.ChipSpec` with its share of the chip, which the cost model
reads like any other spec.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from .faults import SpecError
from .partition import Mode, PartitionTable, Profile
from .spec import ChipSpec


@dataclass(frozen=True)
class Partition:
    """One partition of a layout: its place, profile and derived spec."""

    index: int
    mode: str
    profile: str
    label: str                    # "MIG 3g.40gb", "CPX partition 2", "stack 1"
    spec: ChipSpec
    memory_mode: str | None = None
    slice_start: int = 0          # first compute slice it occupies (placement)
    sub_devices: int = 0

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {"index": self.index, "mode": self.mode, "profile": self.profile, "label": self.label,
                "memory_mode": self.memory_mode, "slice_start": self.slice_start,
                "sub_devices": self.sub_devices, "compute_units": s.compute_units,
                "hbm_bytes": s.hbm_bytes, "hbm_bandwidth": s.hbm_bandwidth, "l2_bytes": s.l2_bytes,
                "copy_engines": s.copy_engines}


@dataclass(frozen=True)
class Layout:
    """A chip split one way: the mode, its memory mode and the partitions in order."""

    text: str                     # as given, normalised ("3g.40gb,4g.40gb", "cpx/nps4")
    mode: Mode
    memory_mode: str | None
    partitions: tuple[Partition, ...]
    chip: str                     # the parent spec's name
    source: str = ""              # where the chip's partition figures come from

    def describe(self) -> dict[str, Any]:
        """The layout as a report's manifest names it."""
        return {"layout": self.text, "mode": self.mode.name, "memory_mode": self.memory_mode,
                "chip": self.chip, "partitions": [p.to_dict() for p in self.partitions]}


#: the largest instance count a layout item may ask for (far above any chip's instance limit)
_MOST = 64
_ITEM = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.+_-]*?)(?::(\d+))?$")


def layout(spec: ChipSpec, text: str) -> Layout:
    """Split chip ``spec`` as ``text`` says: a mode that fixes the layout (``cpx``,
    ``cpx/nps4``, ``flat``) or a list of profiles (``3g.40gb,4g.40gb``, ``1g.10gb:7``)."""
    table = spec.partitions
    if table is None:
        raise SpecError(f"chip spec {spec.name} declares no partition modes, so it cannot be "
                        f"partitioned as {text!r}; choose a chip that has them (fornax specs NAME "
                        "shows a chip's [partitions])")
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"a partition layout is a non-empty string; {spec.name} takes: {table.choices()}")
    text = text.strip().lower()
    name, _, mem = text.partition("/")
    if name in table.modes:
        mode = table.modes[name]
        if mode.choose == "profiles":
            raise SpecError(f"mode {name!r} of {spec.name} is split by listing its profiles, e.g. "
                            f"{next(iter(mode.profiles))}; its profiles: {', '.join(mode.profiles)}")
        split = _fixed(spec, mode, mem or None, text)
    elif mem:
        raise SpecError(f"{text!r}: only a mode that fixes its layout takes a memory mode; "
                        f"{spec.name} takes: {table.choices()}")
    else:
        split = _chosen(spec, table, text)
    return dataclasses.replace(split, source=table.source)


def _fixed(spec: ChipSpec, mode: Mode, mem: str | None, text: str) -> Layout:
    if mem is not None and mem not in mode.memory:
        valid = ", ".join(f"{mode.name}/{m}" for m in mode.memory) or f"{mode.name} (no memory mode)"
        raise SpecError(f"memory mode {mem!r} does not pair with {mode.name} on {spec.name}; "
                        f"valid: {valid}")
    mem = mem or (mode.memory[0] if mode.memory else None)
    profile = next(iter(mode.profiles.values()))
    parts = tuple(_partition(spec, mode, profile, i, i, mem, f"{mode.label} {i}")
                  for i in range(mode.instances))
    norm = mode.name if mem is None or mem == mode.memory[0] else f"{mode.name}/{mem}"
    return Layout(norm, mode, mem, parts, spec.name)


def _chosen(spec: ChipSpec, table: PartitionTable, text: str) -> Layout:
    wanted: list[str] = []
    for item in (p.strip() for p in text.split(",")):
        m = _ITEM.match(item)
        if not m:
            raise SpecError(f"cannot read partition {item!r}: write PROFILE or PROFILE:COUNT; "
                            f"{spec.name} takes: {table.choices()}")
        count = int(m.group(2) or 1)
        if not 1 <= count <= _MOST:
            raise SpecError(f"partition {item!r}: COUNT must be 1 to {_MOST} (a profile's instance "
                            f"limit is its max_instances); {spec.name} takes: {table.choices()}")
        wanted += [m.group(1)] * count
    mode = table.profile_mode(wanted[0])
    if mode is None:
        raise SpecError(f"unknown partition {wanted[0]!r} for {spec.name}; it takes: {table.choices()}")
    for p in wanted:
        if p not in mode.profiles:
            raise SpecError(f"unknown {mode.name} profile {p!r} for {spec.name}; valid profiles: "
                            f"{', '.join(mode.profiles)}")
    for p in dict.fromkeys(wanted):
        n, most = wanted.count(p), mode.profiles[p].max_instances
        if n > most:
            raise SpecError(f"{n} x {p} is more than {spec.name} holds: at most {most} "
                            f"{p} instance(s)")
    used_c = sum(mode.profiles[p].compute_slices for p in wanted)
    used_m = sum(mode.profiles[p].memory_slices for p in wanted)
    if used_c > mode.compute_slices or used_m > mode.memory_slices:
        raise SpecError(f"{text!r} needs {used_c} compute and {used_m} memory slices; {spec.name} has "
                        f"{mode.compute_slices} and {mode.memory_slices}: drop or shrink an instance")
    # largest first, as a GPU instance is placed: each takes the next free compute slices
    order = sorted(wanted, key=lambda p: -mode.profiles[p].compute_slices)
    parts, start = [], 0
    for i, p in enumerate(order):
        prof = mode.profiles[p]
        parts.append(_partition(spec, mode, prof, i, start, None, f"{mode.label} {p}"))
        start += prof.compute_slices
    runs: list[str] = []                  # "1g.10gb:7" for seven of one profile in a row
    for p in dict.fromkeys(order):
        n = order.count(p)
        runs.append(f"{p}:{n}" if n > 1 else p)
    return Layout(",".join(runs), mode, None, tuple(parts), spec.name)


def _partition(spec: ChipSpec, mode: Mode, profile: Profile, index: int, start: int,
               mem: str | None, label: str) -> Partition:
    return Partition(index, mode.name, profile.name, label, derive_spec(spec, profile, label),
                     mem, start, mode.sub_devices)


def derive_spec(parent: ChipSpec, profile: Profile, label: str) -> ChipSpec:
    """The spec of one partition: the chip's figures scaled to its share.

    Peaks, board power, static power and heat capacity scale with the compute units'
    share (the partition's units run at the chip's clock); thermal resistance grows by
    its inverse (the partition's heat rises as the chip's would); HBM capacity,
    bandwidth and L2 scale with the profile's shares; per-unit figures, latencies,
    links and the page size are the chip's.  The name stays the chip's: a partition has
    its chip's architecture.
    """
    share = profile.compute_units / parent.compute_units
    page = parent.page_size
    power = dict(parent.power)
    power.update(static_w=power["static_w"] * share,
                 thermal_capacitance_j_per_c=power["thermal_capacitance_j_per_c"] * share,
                 thermal_resistance_c_per_w=power["thermal_resistance_c_per_w"] / share)
    media = parent.media
    if media is not None:
        counts = profile.media if profile.media is not None else {
            e.kind: int(e.count * share) for e in media.engines}
        engines = tuple(dataclasses.replace(e, count=counts.get(e.kind, 0))
                        for e in media.engines if counts.get(e.kind, 0) > 0)
        media = dataclasses.replace(media, engines=engines) if engines else None
    hbm_bytes = int(parent.hbm_bytes * profile.memory) // page * page
    # the chip's description, then what this partition has of it
    description = (f"{parent.description} ({label}: {profile.compute_units} units, "
                   f"{hbm_bytes / 1e9:.1f} GB at {parent.hbm_bandwidth * profile.bandwidth / 1e12:.2f} TB/s)")
    return dataclasses.replace(
        parent, description=description, compute_units=profile.compute_units,
        hbm_bytes=hbm_bytes,
        hbm_bandwidth=parent.hbm_bandwidth * profile.bandwidth,
        l2_bytes=int(parent.l2_bytes * profile.l2), l2_bandwidth=parent.l2_bandwidth * profile.l2,
        copy_engines=profile.copy_engines, board_power_w=parent.board_power_w * share,
        matrix_peak={k: v * share for k, v in parent.matrix_peak.items()},
        vector_peak={k: v * share for k, v in parent.vector_peak.items()},
        sparse_matrix_peak={k: v * share for k, v in parent.sparse_matrix_peak.items()},
        power=power, media=media, partitions=None)
