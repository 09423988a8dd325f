"""``fornax devices``: the simulated devices of a composed stack, as the family's own tool shows them.

A cuda-like stack is shown the way ``nvidia-smi`` shows GPUs, a rocm-like one the
way ``rocm-smi`` does, an xpu-like one the way ``sycl-ls`` and ``xpu-smi`` do.  The
tool belongs to the driver: the stack's driver family chooses it.  Everything
that makes a tool's look (its name, banner lines, column titles, which version
fields it prints, how it names devices and bus addresses) is data, the
``[tool]`` table of the family's ``vendor.toml``; this module holds the one
renderer that reads it.  The figures come from the simulated device: the
driver's :class:`~fornax.layers.driver.DeviceProperties` and memory info, and
the power and thermal model (:mod:`fornax.sim.power`) along the device's
simulated timeline.

The ``[tool]`` table
--------------------
``name``
    the tool's name (``nvidia-smi-like``).
``device_name``, ``bus_id``
    templates for the device's name and PCI address (over every field but these two).
``numbering``
    per-device numbers, each ``[first, step]``: device ``i`` gets ``first + i * step``
    (a PCI bus number, a KFD topology node).
``fields``
    per-device values the templates print: a literal string, or ``"@a.b.c"``, a
    path into the family's facts (``{target}`` in it is the device's arch name),
    so a version the family already states (``@framework.versions.cuda``) is
    read, not repeated.  Other tables under ``[tool]`` hold data such paths read.
``sections``
    what the tool prints, in order; each has a ``layout``:

    - ``grid``: a box of cells (``nvidia-smi``, ``xpu-smi discovery``): ``widths``
      of the columns, ``rules`` (``top``, ``banner``, ``header``, ``device``: two
      characters each, edge and fill), optional ``banner`` lines across the whole
      width, ``header`` rows and ``device`` rows (one list of cells per line);
    - ``columns``: space-aligned columns under ruled titles (``rocm-smi``):
      ``columns`` (``title``, optional ``subtitle``, ``value``), the ``rule``
      character, and ``before`` / ``after`` lines centred in rules;
    - ``lines``: ``lines`` printed once per device (``sycl-ls``).

``partitions`` (optional)
    how the tool shows a partitioned chip (``fornax devices --partition``): ``sections``
    as above, rendered after the device sections with one row (or line) per partition
    over the partition's fields (:func:`partition_record`: its ``label``, ``profile``,
    ``mode_name``, ``memory_mode_name``, memory, units, engines, ``stacks``, ...);
    ``numbering`` as above, per partition (a GPU-instance id); ``state``, the words
    ``[off, on]`` the device rows print as ``{partition_state}``; ``mode_names``, the
    tool's own word for each mode (``flat = "FLAT"``; default: the mode in capitals);
    ``per_chip``, the ``[tool.numbering]`` keys the partitions share with their chip
    (its PCI bus); ``devices``, what the device sections list: ``partitions`` (default,
    one row each) or ``chip`` (one row for the chip, its figures summed over the
    partitions, as ``nvidia-smi`` shows a GPU in MIG mode).

Templates are Python format strings over the device's fields (``{power_w:.0f}``);
banner, header and before/after lines see device 0's fields.  A tab in a grid
cell spreads its parts over the cell: the first left-aligned, the last
right-aligned.  A field is a plain name: ``{a.b}`` and ``{a[0]}`` are refused.
"""

from __future__ import annotations

import json
import string

import click

from ..layers.errors import ConfigError
from ..layers.face import device_uuid
from ..sim.spec import load_spec
from ..stack import compose, load_config, make_config, runnable_vendors
from .errors import debug_option, handle_errors

SCHEMA = "fornax.devices/1"
MIB = 2**20

#: each layout's required and optional keys
_LAYOUT_KEYS: dict[str, tuple[frozenset, frozenset]] = {
    "grid": (frozenset({"layout", "widths", "rules", "device"}), frozenset({"banner", "header"})),
    "columns": (frozenset({"layout", "columns", "rule"}), frozenset({"before", "after"})),
    "lines": (frozenset({"layout", "lines"}), frozenset()),
}


def _fail(vendor: str, where: str, message: str) -> ConfigError:
    return ConfigError(f"vendor.toml [{where}]: {message}", seam="driver", vendor=vendor,
                       hint=f"fix the [tool] table of the {vendor} vendor.toml (docs/cli.md, "
                            "`fornax devices`, lists what it takes)")


def _strings(value, vendor: str, where: str, key: str, *, length: int | None = None) -> list[str]:
    if (not isinstance(value, list) or not all(isinstance(v, str) for v in value)
            or (length is not None and len(value) != length)):
        size = f" of {length}" if length is not None else ""
        raise _fail(vendor, where, f"{key} must be a list{size} of strings, got {value!r}")
    return value


def _check_section(sec, vendor: str, n: int) -> dict:
    where = f"tool.sections.{n}"
    if not isinstance(sec, dict) or sec.get("layout") not in _LAYOUT_KEYS:
        layout = sec.get("layout") if isinstance(sec, dict) else sec
        raise _fail(vendor, where, f"layout must be one of {', '.join(_LAYOUT_KEYS)}, got {layout!r}")
    required, optional = _LAYOUT_KEYS[sec["layout"]]
    missing, extra = sorted(required - set(sec)), sorted(set(sec) - required - optional)
    if missing or extra:
        raise _fail(vendor, where, f"a {sec['layout']} section takes {', '.join(sorted(required))}"
                    f"{' (and ' + ', '.join(sorted(optional)) + ')' if optional else ''}; "
                    + (f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(extra)}"))
    if sec["layout"] == "grid":
        widths = sec["widths"]
        if not isinstance(widths, list) or not widths or not all(
                isinstance(w, int) and not isinstance(w, bool) and w >= 3 for w in widths):
            raise _fail(vendor, where, f"widths must be a list of column widths >= 3, got {widths!r}")
        rules = sec["rules"]
        need = {"top", "header", "device"} | ({"banner"} if sec.get("banner") else set())
        if (not isinstance(rules, dict) or not need <= set(rules)
                or not all(isinstance(r, str) and len(r) == 2 for r in rules.values())):
            raise _fail(vendor, where, f"rules must give {', '.join(sorted(need))} as two characters "
                        f"(edge, fill), got {rules!r}")
        _strings(sec.get("banner", []), vendor, where, "banner")
        for key in ("header", "device"):
            rows = sec.get(key, [])
            if not isinstance(rows, list):
                raise _fail(vendor, where, f"{key} must be a list of rows, got {rows!r}")
            for row in rows:
                _strings(row, vendor, where, f"each {key} row", length=len(widths))
    elif sec["layout"] == "columns":
        cols = sec["columns"]
        if not isinstance(cols, list) or not cols or not all(
                isinstance(c, dict) and {"title", "value"} <= set(c) <= {"title", "subtitle", "value"}
                and all(isinstance(v, str) for v in c.values()) for c in cols):
            raise _fail(vendor, where, "columns must be a list of { title, value[, subtitle] } "
                        f"strings, got {cols!r}")
        if not isinstance(sec["rule"], str) or len(sec["rule"]) != 1:
            raise _fail(vendor, where, f"rule must be one character, got {sec['rule']!r}")
        for key in ("before", "after"):
            _strings(sec.get(key, []), vendor, where, key)
    else:
        _strings(sec["lines"], vendor, where, "lines")
    return sec


class ToolStyle:
    """A family's ``[tool]`` table, checked: what its device tool looks like."""

    def __init__(self, facts: dict, vendor: str):
        tool = facts.get("tool")
        if not isinstance(tool, dict):
            raise _fail(vendor, "tool", "missing: the family's device tool (name, device_name, "
                        "bus_id, sections)")
        for key in ("name", "device_name", "bus_id"):
            if not isinstance(tool.get(key), str) or not tool[key]:
                raise _fail(vendor, "tool", f"{key} must be a non-empty string, got {tool.get(key)!r}")
        numbering = tool.get("numbering", {})
        if not isinstance(numbering, dict) or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in v) for v in numbering.values()):
            raise _fail(vendor, "tool.numbering", f"each entry must be [first, step] (integers), "
                        f"got {numbering!r}")
        fields = tool.get("fields", {})
        if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
            raise _fail(vendor, "tool.fields", f"each field must be a string (a literal or "
                        f"\"@path.in.facts\"), got {fields!r}")
        sections = tool.get("sections")
        if not isinstance(sections, list) or not sections:
            raise _fail(vendor, "tool", "sections must be a non-empty list of [[tool.sections]] tables")
        self.vendor = vendor
        self.facts = facts
        self.name: str = tool["name"]
        self.device_name: str = tool["device_name"]
        self.bus_id: str = tool["bus_id"]
        self.numbering: dict[str, tuple[int, int]] = {k: (v[0], v[1]) for k, v in numbering.items()}
        self.fields: dict[str, str] = dict(fields)
        self.sections: list[dict] = [_check_section(s, vendor, i) for i, s in enumerate(sections)]
        self.partitions = _PartitionStyle(tool.get("partitions", {}), vendor)

    def field(self, key: str, target: str):
        """The value of ``[tool.fields] key`` for a device of arch ``target``."""
        src = self.fields[key]
        if not src.startswith("@"):
            return src
        path = src[1:].replace("{target}", target)
        node = self.facts
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                raise _fail(self.vendor, "tool.fields",
                            f"{key} = {src!r}: the family's facts have no {path} (device arch {target})")
            node = node[part]
        if not isinstance(node, (str, int, float, bool)):
            raise _fail(self.vendor, "tool.fields", f"{key} = {src!r}: {path} is a {type(node).__name__}, "
                        "not a value a tool prints")
        return node


class _PartitionStyle:
    """The ``[tool.partitions]`` table, checked: how the tool lists a chip's partitions."""

    KEYS = {"sections", "numbering", "state", "mode_names", "per_chip", "devices"}

    def __init__(self, table, vendor: str):
        where = "tool.partitions"
        if not isinstance(table, dict) or set(table) - self.KEYS:
            extra = sorted(set(table) - self.KEYS) if isinstance(table, dict) else table
            raise _fail(vendor, where, f"takes {', '.join(sorted(self.KEYS))}; unknown {extra!r}")
        sections = table.get("sections", [])
        if not isinstance(sections, list):
            raise _fail(vendor, where, "sections must be a list of [[tool.partitions.sections]] tables")
        self.sections: list[dict] = [_check_section(s, vendor, i) for i, s in enumerate(sections)]
        numbering = table.get("numbering", {})
        if not isinstance(numbering, dict) or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in v) for v in numbering.values()):
            raise _fail(vendor, f"{where}.numbering", f"each entry must be [first, step], got {numbering!r}")
        self.numbering: dict[str, tuple[int, int]] = {k: (v[0], v[1]) for k, v in numbering.items()}
        self.state: list[str] = _strings(table.get("state", ["", ""]), vendor, where, "state", length=2)
        names = table.get("mode_names", {})
        if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
            raise _fail(vendor, f"{where}.mode_names", f"each name must be a string, got {names!r}")
        self.mode_names: dict[str, str] = dict(names)
        self.per_chip: list[str] = _strings(table.get("per_chip", []), vendor, where, "per_chip")
        self.devices: str = table.get("devices", "partitions")
        if self.devices not in ("partitions", "chip"):
            raise _fail(vendor, where, f"devices must be partitions or chip, got {self.devices!r}")


class _Template(string.Formatter):
    """``str.format`` over a device's fields, with errors that name the template and the fields."""

    def __init__(self, vendor: str):
        self.vendor = vendor

    def get_field(self, field_name, args, kwargs):
        if not field_name.isidentifier():
            raise _fail(self.vendor, "tool", f"template field {{{field_name}}} is not a plain field "
                        "name (attribute and index access are not allowed)")
        if field_name not in kwargs:
            raise _fail(self.vendor, "tool", f"template field {{{field_name}}} is unknown; fields: "
                        f"{', '.join(sorted(kwargs))}")
        return kwargs[field_name], field_name

    def __call__(self, template: str, view: dict) -> str:
        try:
            return self.vformat(template, (), view)
        except (ValueError, TypeError) as exc:
            raise _fail(self.vendor, "tool", f"template {template!r}: {exc}") from None


# ---- the figures ------------------------------------------------------------------------------
def device_record(stack, index: int, style: ToolStyle) -> dict:
    """One device of ``stack`` as the ``fornax.devices/1`` document lists it.

    Memory comes from the driver's memory info; clock, power and temperature from the
    device's power and thermal model along its simulated timeline so far: the clock the
    last kernel ran at, the average power over the timeline (static power for a device
    that has run nothing: the figure a tool averages over its sample period), the
    temperature when its last work ended, and the share of that time kernels ran.
    """
    props = stack.driver.properties(index)
    free, total = stack.driver.memory_info(index)
    dev = stack.devices[index]
    spec, power = dev.spec, dev.power
    busy = dev.timeline.busy_time
    kernel_s = sum(r.end - r.start for r in dev.timeline.records if r.kind == "kernel")
    faults = dev.injector.log if dev.injector is not None else []
    rec = {
        "index": index,
        "name": "",
        "target": props.target,
        "spec": spec.name,
        "compute_units": props.compute_units,
        "simd_width": props.simd_width,
        "memory_total_bytes": total,
        "memory_used_bytes": total - free,
        "clock_mhz": spec.clock_ghz * 1000 * power.clock_fraction,
        "max_clock_mhz": spec.clock_ghz * 1000,
        "power_w": power.energy_j / power.time_s if power.time_s > 0 else power.static_w,
        "power_cap_w": spec.board_power_w,
        "temperature_c": power.temp_c,
        "throttle_temp_c": power.throttle_c,
        "utilization_pct": 100.0 * kernel_s / busy if busy > 0 else 0.0,
        "ecc_corrected": dev.ecc_corrected,
        "ecc_uncorrected": sum(1 for f in faults if f.kind == "ecc_uncorrectable"),
        "lost": dev.lost is not None,
        "uuid": device_uuid(spec.name, index),
        "bus_id": "",
        "native": dict(props.native),
        "tool": {**{k: first + (0 if dev.partition is not None and k in style.partitions.per_chip
                                else index) * step for k, (first, step) in style.numbering.items()},
                 **{k: style.field(k, props.target) for k in style.fields}},
    }
    rec["tool"]["partition_state"] = style.partitions.state[dev.partition is not None]
    view = view_of(rec, style)
    del view["name"], view["bus_id"]           # what the two templates below make
    fmt = _Template(style.vendor)
    rec["name"] = fmt(style.device_name, view)
    rec["bus_id"] = fmt(style.bus_id, view)
    return rec


def view_of(rec: dict, style: ToolStyle) -> dict:
    """Every field a template sees for one device record: its figures, ``native_<key>`` for
    the driver's native properties, memory in MiB and percent (``memory_total_mib``,
    ``memory_used_mib``, ``vram_pct``), ``guid`` (a short stable id from the UUID),
    ``tool_name``, and the tool's own numbers and fields."""
    view = {k: v for k, v in rec.items() if k not in ("native", "tool")}
    view.update({f"native_{k}": v for k, v in rec["native"].items()
                 if isinstance(v, (str, int, float, bool))})
    view["memory_total_mib"] = rec["memory_total_bytes"] // MIB
    view["memory_used_mib"] = rec["memory_used_bytes"] // MIB
    view["vram_pct"] = 100.0 * rec["memory_used_bytes"] / rec["memory_total_bytes"]
    view["guid"] = int(rec["uuid"].replace("-", "")[:4], 16)
    view["tool_name"] = style.name
    clash = sorted(set(rec["tool"]) & set(view))
    if clash:
        raise _fail(style.vendor, "tool", f"numbering / fields {', '.join(clash)} shadow built-in "
                    f"device fields; rename them")
    view.update(rec["tool"])
    return view


def partition_record(stack, index: int, style: ToolStyle) -> dict:
    """Partition ``index`` of a partitioned stack as its tool lists it: what it is (mode,
    profile, memory mode, the tool's words for them), what it has (units, copy engines,
    video and JPEG decoders, memory in MiB, ``stacks``: the chip's stacks it spans), and its
    state (memory used, uncorrected errors, lost)."""
    dev = stack.devices[index]
    part, lay = dev.partition, stack.layout
    free, total = stack.driver.memory_info(index)
    media = dev.spec.media.engines if dev.spec.media is not None else ()
    jpeg = sum(e.count for e in media if "mjpeg" in e.codecs)
    faults = dev.injector.log if dev.injector is not None else []
    names = style.partitions.mode_names
    stacks = [str(i) for i in range(part.sub_devices)] if part.sub_devices else [str(part.index)]
    return {"index": part.index, "label": part.label, "mode": part.mode,
            "mode_name": names.get(part.mode, part.mode.upper()), "profile": part.profile,
            "memory_mode": part.memory_mode or "",
            "memory_mode_name": names.get(part.memory_mode or "", (part.memory_mode or "N/A").upper()),
            "chip": 0, "compute_units": dev.spec.compute_units, "copy_engines": dev.spec.copy_engines,
            "decoders": sum(e.count for e in media) - jpeg, "jpeg": jpeg,
            "memory_total_mib": total // MIB, "memory_used_mib": (total - free) // MIB,
            "ecc_uncorrected": sum(1 for f in faults if f.kind == "ecc_uncorrectable"),
            "lost": stack.driver.is_lost(index), "sub_devices": part.sub_devices,
            "stacks": ",".join(stacks), "uuid": device_uuid(dev.spec.name, index),
            "slice_start": part.slice_start, "layout": lay.text,
            **{k: first + index * step for k, (first, step) in style.partitions.numbering.items()}}


def chip_record(stack, style: ToolStyle) -> dict:
    """A partitioned stack's chip as one device record (what a tool that lists the chip
    shows): partition 0's record with the chip's name, units and memory, its memory used,
    power and ECC errors summed over the partitions (plus the static power of units no
    partition holds), its temperature the hottest partition's and its utilisation their mean."""
    recs = [device_record(stack, i, style) for i in range(len(stack.devices))]
    rec = dict(recs[0])
    dev = stack.devices[0]
    chip = load_spec(stack.config.spec)
    native = stack.driver.native_properties(dev, rec["target"])
    rec.update(native=native, compute_units=chip.compute_units, memory_total_bytes=chip.hbm_bytes,
               memory_used_bytes=sum(r["memory_used_bytes"] for r in recs),
               # units no partition holds still draw their static power
               power_w=sum(r["power_w"] for r in recs) + chip.power["static_w"] * (
                   1 - sum(d.spec.compute_units for d in stack.devices) / chip.compute_units),
               power_cap_w=chip.board_power_w,
               ecc_uncorrected=sum(r["ecc_uncorrected"] for r in recs),
               ecc_corrected=sum(r["ecc_corrected"] for r in recs),
               temperature_c=max(r["temperature_c"] for r in recs),
               utilization_pct=sum(r["utilization_pct"] for r in recs) / len(recs),
               lost=any(r["lost"] for r in recs))
    view = view_of(rec, style)
    del view["name"], view["bus_id"]
    fmt = _Template(style.vendor)
    rec["name"] = fmt(style.device_name, view)
    return rec


def snapshot(stack, style: ToolStyle | None = None) -> dict:
    """The ``fornax.devices/1`` document of a composed stack (with ``partition`` when the
    stack's chip is partitioned: the layout and one record per partition)."""
    family = stack.vendors["driver"]
    style = style or ToolStyle(family.facts, family.name)
    doc = {"schema": SCHEMA, "vendor": family.name, "tool": style.name,
           "stack": dict(stack.config.seams), "spec": stack.spec.name,
           "spec_source": stack.spec.source, "topology": stack.config.topology,
           "devices": [device_record(stack, i, style) for i in range(stack.driver.device_count())]}
    if stack.layout is not None:
        lay = stack.layout
        doc["partition"] = {"layout": lay.text, "mode": lay.mode.name, "memory_mode": lay.memory_mode,
                            "description": lay.mode.description, "source": lay.source,
                            "select": family.facts["driver"].get("partitions", {}).get("select", ""),
                            "partitions": [partition_record(stack, i, style)
                                           for i in range(len(lay.partitions))]}
        if style.partitions.devices == "chip":
            doc["partition"]["chip"] = chip_record(stack, style)
    return doc


# ---- rendering ---------------------------------------------------------------------------------
def _cell(text: str, width: int) -> str:
    """A cell of ``width`` with a space either side; tab-separated parts spread over it."""
    room = width - 2
    parts = text.split("\t")
    need = sum(map(len, parts)) + len(parts) - 1
    if need > room:                                   # shorten the first part, as the tools do
        keep = max(0, len(parts[0]) - (need - room) - 3)
        parts[0] = parts[0][:keep] + "..." if parts[0] else parts[0]
    if len(parts) == 1:
        body = parts[0].ljust(room)
    else:
        gaps = len(parts) - 1
        spare = room - sum(map(len, parts))
        body = parts[0]
        for i, part in enumerate(parts[1:]):
            body += " " * (spare // gaps + (1 if i < spare % gaps else 0)) + part
    return f" {body[:room]} "


def _grid(sec: dict, views: list[dict], fmt: _Template) -> list[str]:
    widths = sec["widths"]
    rules = sec["rules"]

    def rule(kind: str, joints: bool = True) -> str:
        edge, fill = rules[kind]
        return edge + ("+" if joints else fill).join(fill * w for w in widths) + edge

    def row(cells: list[str], view: dict) -> str:
        return "|" + "|".join(_cell(fmt(c, view), w) for c, w in zip(cells, widths)) + "|"

    banner = sec.get("banner", [])
    out = [rule("top", joints=not banner)]
    if banner:
        inner = sum(widths) + len(widths) - 1
        out += ["|" + _cell(fmt(line, views[0]), inner) + "|" for line in banner]
        out.append(rule("banner"))
    out += [row(cells, views[0]) for cells in sec.get("header", [])]
    out.append(rule("header"))
    for view in views:
        out += [row(cells, view) for cells in sec["device"]]
        out.append(rule("device"))
    return out


def _columns(sec: dict, views: list[dict], fmt: _Template) -> list[str]:
    cols = sec["columns"]
    rows = [[fmt(c["value"], v) for c in cols] for v in views]
    titles = [fmt(c["title"], views[0]) for c in cols]
    subtitles = [fmt(c.get("subtitle", ""), views[0]) for c in cols]
    widths = [max(len(titles[i]), len(subtitles[i]), *(len(r[i]) for r in rows)) for i in range(len(cols))]
    before = [fmt(t, views[0]) for t in sec.get("before", [])]
    after = [fmt(t, views[0]) for t in sec.get("after", [])]
    width = max([sum(widths) + 2 * (len(cols) - 1)] + [len(t) + 4 for t in before + after])
    r = sec["rule"]

    def line(items: list[str]) -> str:
        return "  ".join(x.ljust(w) for x, w in zip(items, widths)).rstrip()

    out = [f" {t} ".center(width, r) for t in before]
    out.append(line(titles))
    if any(subtitles):
        out.append(line(subtitles))
    out.append(r * width)
    out += [line(cells) for cells in rows]
    out.append(r * width)
    out += [f" {t} ".center(width, r) for t in after]
    return out


def _lines(sec: dict, views: list[dict], fmt: _Template) -> list[str]:
    return [fmt(t, v) for v in views for t in sec["lines"]]


LAYOUTS = {"grid": _grid, "columns": _columns, "lines": _lines}


def render(doc: dict, style: ToolStyle) -> str:
    """The ``fornax.devices/1`` document as the family's tool prints it (sections blank-line apart)."""
    fmt = _Template(style.vendor)
    shown = [doc["partition"]["chip"]] if "chip" in doc.get("partition", {}) else doc["devices"]
    views = [view_of(rec, style) for rec in shown]
    out = ["\n".join(LAYOUTS[sec["layout"]](sec, views, fmt)) for sec in style.sections]
    if "partition" in doc:
        parts = [dict(p, tool_name=style.name) for p in doc["partition"]["partitions"]]
        out += ["\n".join(LAYOUTS[sec["layout"]](sec, parts, fmt)) for sec in style.partitions.sections]
    return "\n\n".join(out)


@click.command()
@click.option("--vendor", metavar="V", help=f"Set all five seams to vendor V ({', '.join(runnable_vendors())}); "
                                            "the driver's family chooses the tool.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Stack config TOML (as `fornax compose --config`); flags override it.")
@click.option("--spec", default=None, metavar="NAME", help="Chip spec (see `fornax specs`).")
@click.option("--devices", "count", type=int, default=None, metavar="N",
              help="Simulated devices (default 1, or the config's; at most 1024, 64 in a mesh).")
@click.option("--partition", default=None, metavar="LAYOUT",
              help="Split the chip: MIG-like profiles (3g.40gb,4g.40gb; 1g.10gb:7), a compute mode "
                   "(cpx, cpx/nps4) or a device hierarchy (flat); docs/partitioning.md.")
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.devices/1 JSON document.")
@debug_option
@handle_errors
def devices(vendor, config_path, spec, count, partition, as_json, debug):
    """Show a composed stack's simulated devices the way the family's own tool does
    (nvidia-smi-like, rocm-smi-like, sycl-ls / xpu-smi-like)."""
    base = load_config(config_path) if config_path else None
    if base is None and vendor is None:
        raise ConfigError("no stack given: use --vendor V or --config FILE")
    stack = compose(make_config(vendor, spec=spec, devices=count, base=base, partition=partition))
    family = stack.vendors["driver"]
    style = ToolStyle(family.facts, family.name)
    doc = snapshot(stack, style)
    click.echo(json.dumps(doc, indent=2) if as_json else render(doc, style))
