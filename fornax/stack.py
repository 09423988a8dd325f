"""Compose a Stack from a config: one implementation per seam, a chip spec, devices.

A config comes from flags (``--vendor V`` sets all five seams, ``--seam
SEAM=V`` overrides one) or from a TOML file::

    [stack]
    vendor = "rocm-like"        # every seam, unless overridden below
    spec = "h200-like"
    devices = 1
    topology = "switch"         # fabric between devices: switch, mesh or ring
    meta = false                # shape-only mode: shapes, memory and costs, no data
    translate = true            # allow a declared binary translation (see layers/translate.py)
    seed = 0
    # parallel = "dp"           # with devices >= 2: run on every device, dp (batch split) or tp (weights split)
    # partition = "3g.40gb,4g.40gb"   # split the chip: its partitions are the stack's devices
    #                                 # (docs/partitioning.md: "cpx", "cpx/nps4", "flat", ...)

    [stack.seams]
    library = "rocm-like"

Config files are data: they are parsed with ``tomllib`` and checked key by
key; nothing in them is executed.  Vendor families come from the
``fornax.vendors`` entry-point group (the three built-ins register there
too).  At compose time the compiler's output formats and the library's
shipped formats are negotiated against what the driver loads.  When the
compiler's formats and the driver's do not meet, a translation path the
driver's family declares (``[[translators]]`` in its ``vendor.toml``) is put
between compiler output and driver load; with no such path (or with
``translate = false``) it is a :class:`FormatMismatchError` naming both sides.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Iterable
from importlib import metadata
from pathlib import Path

import numpy as np

from . import heap
from .layers.compiler import CompileOptions, Compiler, PassPipeline, Target
from .layers.driver import Driver
from .layers.library import Library
from .layers.runtime import Runtime
from .layers.errors import ConfigError, FormatMismatchError, UnknownSeamError, UnknownVendorError
from .layers.framework import Framework, RunResult
from .layers.graph import Graph
from .layers.marshal import MarshallingLibrary, marshal_paths
from .layers.portability import Crossing, declared_layers, generic
from .layers.runtime.handles import Stream
from .layers.translate import (TranslatingCompiler, Translator, TranslationPath, candidate_paths,
                               lane_efficiency)
from .layers.vendor import SEAMS, Vendor
from .sim.chip import Chip
from .sim.device import Device
from .sim.layout import Layout, layout
from .sim.replay import ReplayCache
from .sim.faults import SpecError
from .sim import tomlfile
from .sim.spec import ChipSpec, load_spec
from .sim.topology import KINDS as TOPOLOGY_KINDS
from .sim.topology import Topology

BUILTIN = {
    "cuda-like": "fornax.vendors.cuda_like:VENDOR",
    "rocm-like": "fornax.vendors.rocm_like:VENDOR",
    "xpu-like": "fornax.vendors.xpu_like:VENDOR",
    "null": "fornax.vendors.null:VENDOR",
}
DEFAULT_SPEC = "h200-like"
#: devices one process simulates (each a full device model; every device learns every
#: other's memory for fault attribution), and a full mesh's (a link per ordered pair)
MAX_DEVICES = 1024
MAX_MESH_DEVICES = 64

_STACK_KEYS = {"vendor", "spec", "devices", "seed", "seams", "topology", "meta", "translate", "paths",
               "nodes", "parallel", "replay", "partition"}
#: how a workload runs over several devices of one process (``--parallel``): ``dp`` splits the
#: batch over the devices, ``tp`` splits the weights (Megatron's column/row split)
PARALLEL_MODES = ("dp", "tp")


def _load_object(ref: str, name: str) -> Vendor:
    module, _, attr = ref.partition(":")
    try:
        obj = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
    except Exception as exc:  # a broken third-party plugin must not crash the CLI
        raise ConfigError(f"vendor {name!r} ({ref}) failed to load: {type(exc).__name__}: {exc}",
                          hint="check the plugin's installation") from None
    if not isinstance(obj, Vendor):
        raise ConfigError(f"vendor {name!r} ({ref}) is a {type(obj).__name__}, not a fornax Vendor")
    return obj


def vendor_refs() -> dict[str, str]:
    """Every registered vendor name -> its entry-point reference."""
    refs = dict(BUILTIN)
    for ep in metadata.entry_points(group="fornax.vendors"):
        refs.setdefault(ep.name, ep.value)
    return refs


#: vendors that are templates to copy, not families to run: every hook of ``null`` raises
#: "not implemented" (it is what conformance suites are tried on and new families start from)
TEMPLATES = frozenset({"null"})


def runnable_vendors() -> list[str]:
    """The vendor names a stack can be composed from (every registered one but the templates):
    the one family registry, built-in and third-party (the ``fornax.vendors`` entry points)."""
    return sorted(set(vendor_refs()) - TEMPLATES)


#: the families fornax ships (what per-family data such as known-failure tables exists for)
BUILTIN_FAMILIES: tuple[str, ...] = tuple(sorted(set(BUILTIN) - TEMPLATES))


def _valid_vendors() -> str:
    return f"valid vendors: {', '.join(runnable_vendors())} ({', '.join(sorted(TEMPLATES))} is a template)"


def get_vendor(name: str) -> Vendor:
    refs = vendor_refs()
    if name not in refs:
        raise UnknownVendorError(f"unknown vendor {name!r}; {_valid_vendors()}")
    return _load_object(refs[name], name)


@dataclass
class StackConfig:
    seams: dict[str, str]
    spec: str = DEFAULT_SPEC
    devices: int = 1
    seed: int = 0
    topology: str = "switch"
    meta: bool = False             # shape-only devices: no data, costs from kernel estimates
    translate: bool = True         # allow a declared binary translation when formats do not meet
    fuse: bool = True              # compiler fusion (off: one kernel per op, --no-fuse)
    dump_ir: str | None = None     # directory the compiler writes the IR after each pass to
    #: portability paths chosen by name over each boundary's default (``--path NAME``)
    paths: tuple[str, ...] = ()
    #: a chosen path that carries no crossing of the stack is an error (False: it is ignored,
    #: as ``fornax compare --all-combos --path`` wants over many stacks)
    paths_strict: bool = True
    #: nodes the devices are spread over (equal consecutive blocks; joined by the NIC tier)
    nodes: int = 1
    #: run the workload on every device (``--parallel``): dp, tp, or None (device 0 only)
    parallel: str | None = None
    #: kernels launched again replay their recorded tape (and fast paths); off: every launch
    #: runs through the interpreter, the reference (``--no-replay``: the same results, slower)
    replay: bool = True
    #: the chip split into partitions (``--partition``): a layout its spec's ``[partitions]``
    #: table takes (``3g.40gb,4g.40gb``, ``cpx/nps4``, ``flat``); its partitions are the
    #: stack's devices.  None: the whole chip is one device
    partition: str | None = None

    def describe(self) -> dict[str, Any]:
        out = {"seams": dict(self.seams), "spec": self.spec, "devices": self.devices, "seed": self.seed,
               "topology": self.topology, "meta": self.meta, "translate": self.translate,
               "fuse": self.fuse, "paths": list(self.paths), "nodes": self.nodes, "replay": self.replay}
        if self.partition is not None:
            out["partition"] = self.partition
        return out


def parse_seam_overrides(items: Iterable[object] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        seam, sep, vendor = str(item).partition("=")
        seam, vendor = seam.strip(), vendor.strip()
        if not sep or not seam or not vendor:
            raise ConfigError(f"--seam takes SEAM=VENDOR, got {item!r}",
                              hint=f"seams: {', '.join(SEAMS)}")
        if seam not in SEAMS:
            raise UnknownSeamError(f"unknown seam {seam!r}; valid seams: {', '.join(SEAMS)}")
        out[seam] = vendor
    return out


def make_config(vendor: str | None = None, seams: dict[str, str] | None = None,
                spec: str | None = None, devices: int | None = None, seed: int | None = None,
                base: StackConfig | None = None, topology: str | None = None,
                meta: bool | None = None, translate: bool | None = None,
                fuse: bool | None = None, dump_ir: str | None = None,
                paths: Iterable[str] | None = None, nodes: int | None = None,
                parallel: str | None = None, replay: bool | None = None,
                partition: str | None = None) -> StackConfig:
    """Build a config; flags given here override ``base`` (a config file)."""
    cfg = StackConfig(dict(base.seams) if base else {}, *( (base.spec, base.devices, base.seed) if base else ()))
    if base is not None:
        cfg.topology = base.topology
        cfg.nodes = base.nodes
        cfg.parallel = base.parallel
    if parallel is not None:
        cfg.parallel = parallel
    if cfg.parallel is not None and cfg.parallel not in PARALLEL_MODES:
        raise ConfigError(f"unknown parallel mode {cfg.parallel!r}; choose one of: "
                          f"{', '.join(PARALLEL_MODES)}",
                          hint="dp splits the batch over the devices, tp splits the weights")
    if topology is not None:
        cfg.topology = topology
    if nodes is not None:
        cfg.nodes = nodes
    cfg.meta = bool(meta) if meta is not None else (base.meta if base is not None else False)
    cfg.translate = (bool(translate) if translate is not None
                     else (base.translate if base is not None else True))
    cfg.fuse = bool(fuse) if fuse is not None else (base.fuse if base is not None else True)
    cfg.replay = bool(replay) if replay is not None else (base.replay if base is not None else True)
    # an empty partition asks for the whole chip over a config file's layout
    cfg.partition = (partition or None) if partition is not None else (base.partition if base is not None else None)
    if cfg.partition is not None and (not isinstance(cfg.partition, str) or not cfg.partition.strip()):
        raise ConfigError(f"partition must name a layout of the chip's partition modes, got {cfg.partition!r}",
                          hint='e.g. partition = "3g.40gb" on h100-like, "cpx" on mi300x-like, "flat" '
                               "on max1550-like (docs/partitioning.md)")
    cfg.dump_ir = dump_ir if dump_ir is not None else (base.dump_ir if base is not None else None)
    chosen = list(paths) if paths is not None and list(paths) else (list(base.paths) if base else [])
    for name in chosen:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"a path is named by a non-empty string, got {name!r}",
                              hint="`fornax compose --seam ...` without --path shows the paths a stack takes")
    cfg.paths = tuple(dict.fromkeys(n.strip() for n in chosen))
    if cfg.paths and not cfg.translate:
        raise ConfigError(f"--path {cfg.paths[0]} chooses a cross-family path, but cross-family paths "
                          "are switched off (--no-translate / translate = false)",
                          hint="drop one of the two")
    if vendor is not None:
        cfg.seams = {s: vendor for s in SEAMS}
    for seam, v in (seams or {}).items():
        if seam not in SEAMS:
            raise UnknownSeamError(f"unknown seam {seam!r}; valid seams: {', '.join(SEAMS)}")
        cfg.seams[seam] = v
    missing = [s for s in SEAMS if s not in cfg.seams]
    if missing:
        raise ConfigError(f"no vendor for seam(s) {', '.join(missing)}",
                          hint="give --vendor V, or set every seam with --seam SEAM=V")
    if spec is not None:
        cfg.spec = spec
    if devices is not None:
        cfg.devices = devices
    if seed is not None:
        cfg.seed = seed
    if not isinstance(cfg.devices, int) or isinstance(cfg.devices, bool) or cfg.devices < 1:
        raise ConfigError(f"devices must be a positive integer, got {cfg.devices!r}")
    if not isinstance(cfg.topology, str) or cfg.topology not in TOPOLOGY_KINDS:
        raise ConfigError(f"unknown topology {cfg.topology!r}; choose one of: "
                          f"{', '.join(TOPOLOGY_KINDS)}")
    limit = MAX_MESH_DEVICES if cfg.topology == "mesh" else MAX_DEVICES
    if cfg.devices > limit:
        raise ConfigError(f"{cfg.devices} devices is more than one fornax process simulates"
                          f"{' in a full mesh' if cfg.topology == 'mesh' else ''} (at most {limit})",
                          hint="a mesh links every pair of devices (real ones join 8); use the "
                               "switch or ring topology for more" if cfg.topology == "mesh" else
                               f"simulate at most {MAX_DEVICES} devices per process")
    if cfg.partition is not None and cfg.parallel is not None:
        raise ConfigError(f"--parallel {cfg.parallel} runs one rank per chip (--devices N), not over the "
                          f"partitions of one chip ({cfg.partition!r})",
                          hint="drop --partition to run ranks on whole chips, or drop --parallel to run "
                               "on partition 0")
    if cfg.partition is not None and cfg.devices != 1:
        raise ConfigError(f"partition {cfg.partition!r} splits one chip into devices, but the stack asks "
                          f"for {cfg.devices} chips", hint="drop --devices (the partitions are the "
                          "stack's devices) or drop --partition")
    if (not isinstance(cfg.nodes, int) or isinstance(cfg.nodes, bool) or cfg.nodes < 1
            or cfg.devices % cfg.nodes):
        raise ConfigError(f"nodes must be a positive integer that divides the {cfg.devices} device(s) "
                          f"evenly, got {cfg.nodes!r}", hint="e.g. --devices 8 --nodes 2: four devices a node")
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {cfg.seed!r}")
    refs = vendor_refs()
    for seam, v in cfg.seams.items():
        if isinstance(v, str) and v in TEMPLATES:
            raise UnknownVendorError(
                f"vendor {v!r} (seam {seam}) is the template vendor: every hook raises \"not "
                f"implemented\", so no stack runs on it; {_valid_vendors()}",
                hint=f"copy fornax/vendors/{v} to start a family (docs/guide.md); `fornax conform "
                     f"SEAM --vendor {v}` shows what each seam still lacks")
        if not isinstance(v, str) or v not in refs:
            raise UnknownVendorError(f"unknown vendor {v!r} for seam {seam}; {_valid_vendors()}")
    return cfg


def load_config(path: str | Path) -> StackConfig:
    """Read a stack config TOML file (data only) into a base config."""
    p = Path(path)
    data = tomlfile.read(p, "config file", ConfigError)
    unknown_top = sorted(set(data) - {"stack"})
    if unknown_top:
        raise ConfigError(f"config file {p}: unknown table(s) {', '.join(unknown_top)}; "
                          "everything goes under [stack]")
    stack = data.get("stack")
    if not isinstance(stack, dict):
        raise ConfigError(f"config file {p} has no [stack] table")
    unknown = sorted(set(stack) - _STACK_KEYS)
    if unknown:
        raise ConfigError(f"config file {p}: unknown key(s) {', '.join(unknown)} in [stack]; "
                          f"known keys: {', '.join(sorted(_STACK_KEYS))}")
    seams = stack.get("seams", {})
    if not isinstance(seams, dict):
        raise ConfigError(f"config file {p}: [stack.seams] must be a table of SEAM = \"vendor\"")
    bad = sorted(set(seams) - set(SEAMS))
    if bad:
        raise UnknownSeamError(f"config file {p}: unknown seam(s) {', '.join(bad)}; "
                               f"valid seams: {', '.join(SEAMS)}")
    for key, typ in (("vendor", str), ("spec", str)):
        if key in stack and not isinstance(stack[key], typ):
            raise ConfigError(f"config file {p}: {key} must be a string, got {stack[key]!r}")
    base = StackConfig({}, stack.get("spec", DEFAULT_SPEC), stack.get("devices", 1), stack.get("seed", 0),
                       stack.get("topology", "switch"))
    if not isinstance(stack.get("meta", False), bool):
        raise ConfigError(f"config file {p}: meta must be true or false, got {stack['meta']!r}")
    base.meta = stack.get("meta", False)
    if not isinstance(stack.get("translate", True), bool):
        raise ConfigError(f"config file {p}: translate must be true or false, got {stack['translate']!r}")
    base.translate = stack.get("translate", True)
    if not isinstance(stack.get("replay", True), bool):
        raise ConfigError(f"config file {p}: replay must be true or false, got {stack['replay']!r}")
    base.replay = stack.get("replay", True)
    paths = stack.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(n, str) for n in paths):
        raise ConfigError(f"config file {p}: paths must be a list of path names, got {paths!r}",
                          hint='e.g. paths = ["hipify-like"]')
    base.paths = tuple(paths)
    base.nodes = stack.get("nodes", 1)
    if "parallel" in stack and not isinstance(stack["parallel"], str):
        raise ConfigError(f"config file {p}: parallel must be a string "
                          f"({' or '.join(map(repr, PARALLEL_MODES))}), got {stack['parallel']!r}")
    base.parallel = stack.get("parallel")
    if "partition" in stack and not isinstance(stack["partition"], str):
        raise ConfigError(f"config file {p}: partition must be a string naming a layout, got "
                          f"{stack['partition']!r}", hint='e.g. partition = "3g.40gb,4g.40gb" or "cpx/nps4"')
    base.partition = stack.get("partition")
    return make_config(stack.get("vendor"), seams, base=base)


def describe_seams(seams: dict[str, str], spec: str) -> str:
    """A stack in words, from its seams' families and its chip: ``rocm-like on h200-like``, or
    ``framework=..., compiler=..., ...`` pairs when the seams differ."""
    names = sorted(set(seams.values()))
    who = names[0] if len(names) == 1 else ", ".join(f"{k}={v}" for k, v in seams.items())
    return f"{who} on {spec}"


@dataclass
class Stack:
    config: StackConfig
    spec: ChipSpec
    devices: list[Device]
    vendors: dict[str, Vendor]
    driver: Driver
    runtime: Runtime
    library: Library
    compiler: Compiler
    framework: Framework
    target: Target
    negotiation: dict[str, Any] = field(default_factory=dict)
    topology: Topology | None = None     # the fabric joining the devices
    #: per-stack state of the front ends (the JAX client that serves this stack, ...)
    frontends: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: how the chip is split when the stack is partitioned (its partitions are ``devices``)
    layout: Layout | None = None

    def seam(self, name: str) -> Driver | Runtime | Library | Compiler | Framework:
        """The implementation composed for seam ``name`` (one of :data:`SEAMS`)."""
        seams: dict[str, Driver | Runtime | Library | Compiler | Framework] = {
            "driver": self.driver, "runtime": self.runtime, "library": self.library,
            "compiler": self.compiler, "framework": self.framework}
        if name not in seams:
            raise UnknownSeamError(f"unknown seam {name!r}; valid seams: {', '.join(SEAMS)}")
        return seams[name]

    def describe(self) -> str:
        """The stack in words: its family (or ``seam=family`` pairs when seams differ) on its chip."""
        return describe_seams(self.config.seams, self.spec.name)

    def run(self, graph: Graph, feeds: dict[str, np.ndarray]) -> RunResult:
        return self.framework.run(graph, feeds)

    def communicator(self, devices: list[int] | None = None, timeout_s: float | None = None) -> Any:
        """The library's communicator over ``devices`` (default: all of the stack's)."""
        return self.library.communicator(devices, timeout_s)


def _pick(names: list[str], forced: tuple[str, ...], defaults: list[bool] | None = None) -> int | None:
    """Which of a boundary's candidate paths (by name, in preference order) carries it: the
    first one ``--path`` names, else the first default one (a port only when nothing else is
    declared), else None when there is no candidate."""
    for i, name in enumerate(names):
        if name in forced:
            return i
    if not names:
        return None
    ok = defaults or [True] * len(names)
    return next((i for i, d in enumerate(ok) if d), 0)


def _translator(vendors: dict[str, Vendor], devices: list[Device], compiler: Compiler,
                path: TranslationPath) -> TranslatingCompiler:
    """The compiler behind ``path``: the compiler family's own loader decodes its output, the
    driver family's own encoder re-encodes it; a translation keeps the source group layout
    (lane efficiency from the two families' SIMD widths)."""
    src, dst = vendors["compiler"], vendors["driver"]
    encoders = getattr(dst.compiler, "encoders", {}) or {}
    if path.to_format not in encoders:
        raise ConfigError(f"vendor {path.vendor} declares path {path.name} to {path.to_format}, "
                          f"but the {dst.name} compiler has no {path.to_format} encoder",
                          hint="fix the family's [[translators]] or [[portability.compiler]] table")
    loader = src.driver(devices)          # the source family's loader: names the arch, decodes
    lanes = lane_efficiency(int(src.facts["driver"]["simd_width"]), int(dst.facts["driver"]["simd_width"]))
    translator = Translator(path, loader.decode_image, encoders[path.to_format], lanes)
    return TranslatingCompiler(compiler, translator, loader.target(0))


def _layer(config: StackConfig, vendors: dict[str, Vendor], upper: str, lower: str,
           table: str, key: str) -> Crossing:
    """The crossing of ``upper/lower`` when their families differ: a declared layer (or port) of
    the upper family for the lower one, or fornax's generic adapter."""
    fam, v = config.seams, vendors[upper]
    boundary = f"{upper}/{lower}"
    declared = declared_layers(v.facts, v.name, table, key, fam[lower], boundary)
    i = _pick([c.name for c in declared], config.paths, [c.mechanism != "port" for c in declared])
    if i is None:
        return generic(boundary, fam[upper], fam[lower])
    return _chosen(declared[i], [c.name for c in declared], config.paths)


def _chosen(c: Crossing, names: list[str], forced: tuple[str, ...]) -> Crossing:
    """``c`` with the other paths of its boundary and whether ``--path`` chose it."""
    return dataclasses.replace(c, alternatives=tuple(n for n in names if n != c.name),
                               forced=c.name in forced)


def _unused_paths(config: StackConfig, offered: dict[str, list[str]]) -> None:
    """A path ``--path`` names that carries no crossing of this stack is an error that lists
    the paths each of its crossings offers."""
    used = {n for names in offered.values() for n in names}
    unknown = [n for n in config.paths if n not in used]
    if not unknown or not config.paths_strict:
        return
    where = "; ".join(f"{b}: {', '.join(names) or 'none declared'}" for b, names in offered.items())
    raise ConfigError(f"path {unknown[0]!r} carries no crossing of this stack "
                      f"({describe_seams(config.seams, config.spec)}); "
                      + (f"its crossings and the paths declared for them: {where}" if offered
                         else "every seam is from one family, so nothing crosses"),
                      hint="name one of the paths listed, or drop --path")


def compose(config: StackConfig) -> Stack:
    heap.freeze_at_compose()
    try:
        spec = load_spec(config.spec)
    except SpecError as exc:
        raise ConfigError(str(exc)) from None
    vendors = {seam: get_vendor(config.seams[seam]) for seam in SEAMS}
    # one bounded recording cache for the stack's devices (limit 0: every launch interpreted)
    replays = ReplayCache() if config.replay else ReplayCache(0, fast=False)
    split = _layout(spec, config.partition) if config.partition is not None else None
    specs = [p.spec for p in split.partitions] if split is not None else [spec] * config.devices
    devices = [Device(s, i, meta=config.meta, replays=replays) for i, s in enumerate(specs)]
    if split is not None:
        Chip[Device](split).attach(devices)
        spec = specs[0]                   # the spec of the device a run uses
    try:
        topology = Topology.build(spec, len(devices), config.topology, config.nodes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if split is None or split.mode.peer:  # partitions with no fabric between them reach no peer
        topology.connect(devices)
    driver = vendors["driver"].driver(devices)
    loadable = tuple(driver.loadable_formats(0))
    runtime = vendors["runtime"].runtime(driver)
    library = vendors["library"].library(runtime)
    compiler = vendors["compiler"].compiler()
    if isinstance(compiler, PassPipeline):   # the shared pipeline's options (fusion, IR dumps)
        compiler.options = CompileOptions(fuse=config.fuse, dump_ir=config.dump_ir)
    emits = tuple(compiler.output_formats())
    chosen = next((f for f in emits if f in loadable), None)
    fam = config.seams
    crossings: list[Crossing] = []
    offered: dict[str, list[str]] = {}      # boundary -> the paths declared for it
    for upper, lower, table, key in (("framework", "runtime", "framework", "runtime"),
                                     ("runtime", "driver", "runtime", "driver")):
        if fam[upper] != fam[lower]:
            crossings.append(_layer(config, vendors, upper, lower, table, key))
            offered[f"{upper}/{lower}"] = [crossings[-1].name, *crossings[-1].alternatives]
    translator = None
    if chosen is None and config.translate:
        src, dst = vendors["compiler"], vendors["driver"]
        cands = candidate_paths(src.facts, src.name, dst.facts, dst.name, emits, loadable)
        i = _pick([p.name for p in cands], config.paths, [p.mechanism != "port" for p in cands])
        if i is not None:
            translator = _translator(vendors, devices, compiler, cands[i])
            p = cands[i]
            crossings.append(_chosen(Crossing("compiler/driver", fam["compiler"], fam["driver"],
                                              p.mechanism, p.name, p.real_name, p.vendor, basis=p.basis),
                                     [c.name for c in cands], config.paths))
            offered["compiler/driver"] = [c.name for c in cands]
    if chosen is None and translator is None:
        raise FormatMismatchError(
            f"compiler {vendors['compiler'].name} emits {', '.join(emits)}, but driver "
            f"{vendors['driver'].name} loads only {', '.join(loadable)}",
            hint="pick a compiler and driver of one family, or a driver that loads the compiler's format"
                 + (" (cross-family paths are switched off)" if not config.translate else
                    " (no portability path is declared between them)"))
    shipped = tuple(library.formats())
    lib_ok = [f for f in shipped if f in loadable]
    if not lib_ok and config.translate:
        # the library's API over the driver family's own library (hipBLAS over cuBLAS, oneMath's
        # backends, ZLUDA's cuBLAS over rocBLAS), where the library's family declares it
        mpaths = [m for m in marshal_paths(vendors["library"].facts, vendors["library"].name)
                  if m.backend == vendors["driver"].name]
        i = _pick([m.name for m in mpaths], config.paths)
        if i is not None:
            m = mpaths[i]

            def charge(stream: Any, seconds: float) -> None:
                # the forwarding layer's host time, spent before the backend launches
                dev = stream.device if isinstance(stream, Stream) else runtime.current_device()
                devices[dev].timeline.host_time += seconds
            library = MarshallingLibrary(m, library.name, vendors["driver"].library(runtime), charge)
            lib_ok = [f for f in library.formats() if f in loadable]
            crossings.append(_chosen(Crossing("library/driver", fam["library"], fam["driver"], "marshal",
                                              m.name, m.real_name, m.front, basis=m.basis),
                                     [x.name for x in mpaths], config.paths))
            offered["library/driver"] = [x.name for x in mpaths]
    if not lib_ok:
        raise FormatMismatchError(
            f"library {vendors['library'].name} ships {', '.join(shipped)} kernels, but driver "
            f"{vendors['driver'].name} loads only {', '.join(loadable)}",
            hint="pick a library of the driver's family"
                 + (" (cross-family paths are switched off)" if not config.translate else
                    " (its family declares no path to this driver's library)"))
    _unused_paths(config, offered)
    props = driver.properties(0)
    if translator is not None:
        compiler, chosen = translator, translator.translator.to_format
    if chosen is None:        # refused above: no shared format and no translation path
        raise FormatMismatchError(f"no format of compiler {vendors['compiler'].name} reaches driver "
                                  f"{vendors['driver'].name}")
    target = Target(props.target, chosen, props.compute_units)
    framework = vendors["framework"].framework(compiler, library, runtime, target)
    framework.meta = config.meta
    framework.capture_plans = config.replay      # --no-replay: every plan run walks its steps
    negotiation = {"driver_loads": list(loadable), "compiler_emits": list(emits),
                   "compiler_format": chosen, "library_ships": list(shipped),
                   "library_formats_usable": lib_ok, "target": props.target}
    if translator is not None:
        p = translator.translator.path
        negotiation["compiler_format"] = p.from_format
        negotiation["translation"] = {"path": p.name, "from": p.from_format, "to": p.to_format,
                                      "declared_by": p.vendor, "source_target": translator.source_arch,
                                      "driver_format": p.to_format}
    # in boundary order: framework/runtime, runtime/driver, compiler/driver, library/driver
    negotiation["crossings"] = [c.to_dict() for c in crossings]
    return Stack(config, spec, devices, vendors, driver, runtime, library, compiler, framework,
                 target, negotiation, topology, layout=split)


def _layout(spec: ChipSpec, text: str) -> Layout:
    """``spec`` split as ``text`` says, or a ConfigError that lists what the chip takes."""
    try:
        return layout(spec, text)
    except SpecError as exc:
        raise ConfigError(str(exc), seam="driver",
                          hint="fornax specs NAME --json lists the chip's [partitions]; "
                               "docs/partitioning.md explains each mode") from None
