"""The compile cache: content-addressed, in memory and on disk.

A compiled graph is found again by its **key**: a SHA-256 over the graph's
text, the bytes (and dtype and shape) of its constants, the target (arch,
format, compute units), the compiler (vendor, compiler name, fornax
version, a digest of the compiling code, the family's ``[compiler]`` facts) and the options (library
routines offered, fusion and passes).  Change any of them and the key
changes; nothing is ever looked up by name.

Two levels:

- **memory**: a dict per compiler instance (a repeated run in one process);
- **disk**: one file per key under ``$FORNAX_CACHE_DIR`` (default: the user
  cache directory, ``$XDG_CACHE_HOME/fornax`` or ``~/.cache/fornax``;
  ``FORNAX_CACHE_DIR=off`` turns the disk level off).  An entry is the
  serialised plan (the binary's bytes, the launch plan, the kernels, the
  log and stats) framed by a magic number, a format version and the
  SHA-256 of its payload, written to a temporary file and renamed into
  place, so a reader never sees half an entry.  Constant tensors are not
  stored: they are part of the key, and re-attached from the graph being
  compiled.  An entry that is truncated, corrupt, or of another version is
  detected, counted (``corrupt``), deleted and rebuilt -- never loaded.

Hits and misses of both levels are counted in :attr:`CompileCache.stats`,
which the compiler's report carries; ``bypassed`` counts compiles that skipped the
lookup because the IR after each pass was asked for (``--dump-ir``,
``FORNAX_LOG=compiler``), which only a real compile produces.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import hashlib
import importlib
import json
import os
import struct
import tempfile
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from ..sim import isa
from .graph import Graph

#: what the cache holds (the compiler's CompiledGraph)
PlanT = TypeVar("PlanT")


class TargetLike(Protocol):
    """The parts of a compile target a key covers."""

    @property
    def arch(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def compute_units(self) -> int: ...

MAGIC = b"FXCC"
VERSION = 1
_HEAD = struct.Struct("<4sI32s")           # magic, format version, sha256(payload)


@lru_cache(maxsize=1)
@functools.cache
def fornax_version() -> str:
    try:
        from importlib import metadata
        return metadata.version("fornax")
    except Exception:                      # not installed (a source checkout): still a stable key
        return "source"


@functools.cache
def source_digest() -> str:
    """SHA-256 of the code that turns a graph into a plan: the seams' shared code
    (``fornax/layers``), the vendors' and the tile ISA.  Part of every key, so an entry
    written by other code (a checkout between releases changes code, not its version) is
    never found again."""
    pkg = Path(__file__).resolve().parent.parent
    files = sorted([*(pkg / "layers").rglob("*.py"), *(pkg / "vendors").rglob("*.py"),
                    pkg / "sim" / "isa.py"])
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(pkg).as_posix().encode() + b"\0")
        try:
            h.update(f.read_bytes())
        except OSError:             # unreadable: its name still counts (the key stays stable)
            pass
    return h.hexdigest()


def default_directory() -> Path | None:
    """Where disk entries go: ``$FORNAX_CACHE_DIR`` (``off``: nowhere), else the user cache
    directory (``$XDG_CACHE_HOME/fornax``, ``~/.cache/fornax``)."""
    env = os.environ.get("FORNAX_CACHE_DIR")
    if env is not None and env.strip():
        return None if env.strip().lower() == "off" else Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "fornax"


def identity_text(compiler: dict[str, Any]) -> str:
    """The compiler's part of a cache key (vendor, facts, fornax version) as canonical JSON."""
    return json.dumps(compiler, sort_keys=True, default=str)


def cache_key(graph: Graph, target: TargetLike, compiler: dict[str, Any] | str | bytes,
              options: str) -> str:
    """The content address of one compilation (see the module docstring).  ``compiler``:
    the compiler's identity, or its :func:`identity_text` (as text or UTF-8 bytes) worked out
    before: the same key either way."""
    h = hashlib.sha256(b"fornax compile cache v%d\0" % VERSION)
    h.update(str(graph).encode())
    for v in graph.constants:
        arr = np.ascontiguousarray(v.const)
        h.update(f"\0{v.name}:{arr.dtype.name}:{arr.shape}\0".encode())
        h.update(arr.tobytes())
    h.update(f"\0{target.arch}|{target.format}|{target.compute_units}\0".encode())
    if not isinstance(compiler, bytes):
        compiler = (compiler if isinstance(compiler, str) else identity_text(compiler)).encode()
    h.update(compiler)
    h.update(b"\0" + options.encode())
    return h.hexdigest()


# ---- serialising a plan -------------------------------------------------------------------
class _Unserialisable(TypeError):
    pass


def _allowed_class(path: str) -> Any:
    """The fornax plan class (or enum) ``module:qualname`` names; ValueError for any other."""
    module, _, name = path.partition(":")
    if not (module.startswith("fornax.layers") or module == "fornax.sim.isa"):
        raise ValueError(f"class {path} is not a fornax plan type")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class _Encoder:
    """A plan as JSON-ready data (constants of the graph by index)."""

    def __init__(self, constants: list[NDArray[Any]]):
        self.constants = constants

    def __call__(self, obj: object) -> Any:
        if isinstance(obj, enum.Enum):
            cls = type(obj)
            return {"__enum__": f"{cls.__module__}:{cls.__qualname__}", "value": obj.value}
        if obj is None or isinstance(obj, (bool, str, int, float)):
            return obj
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, isa.Program):
            return {"__program__": isa.encode(obj).decode()}
        if isinstance(obj, np.ndarray):
            for i, c in enumerate(self.constants):
                if c is obj or (c.shape == obj.shape and c.dtype == obj.dtype
                                and np.array_equal(c, obj, equal_nan=c.dtype.kind == "f")):
                    return {"__const__": i}
            arr = np.ascontiguousarray(obj)
            return {"__array__": base64.b64encode(arr.tobytes()).decode(), "dtype": arr.dtype.name,
                    "shape": list(arr.shape)}
        if isinstance(obj, bytes):
            return {"__bytes__": base64.b64encode(obj).decode()}
        if isinstance(obj, tuple):
            return {"__tuple__": [self(x) for x in obj]}
        if isinstance(obj, (set, frozenset)):
            return {"__frozenset__": [self(x) for x in sorted(obj, key=repr)]}
        if isinstance(obj, list):
            return [self(x) for x in obj]
        if isinstance(obj, dict):
            if all(isinstance(k, str) for k in obj):
                return {"__dict__": [[k, self(v)] for k, v in obj.items()]} if any(
                    k.startswith("__") for k in obj) else {k: self(v) for k, v in obj.items()}
            return {"__dict__": [[self(k), self(v)] for k, v in obj.items()]}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            dc = type(obj)
            path = f"{dc.__module__}:{dc.__qualname__}"
            try:
                _allowed_class(path)
            except (ValueError, ImportError, AttributeError):
                raise _Unserialisable(f"{path} is not a fornax plan type") from None
            return {"__dc__": path, "fields": {f.name: self(getattr(obj, f.name))
                                               for f in dataclasses.fields(obj)}}
        raise _Unserialisable(f"cannot store a {type(obj).__name__} in the compile cache")


def _decode(obj: Any, constants: list[NDArray[Any]]) -> Any:
    if isinstance(obj, list):
        return [_decode(x, constants) for x in obj]
    if not isinstance(obj, dict):
        return obj
    if "__program__" in obj:
        return isa.decode(obj["__program__"].encode())
    if "__const__" in obj:
        return constants[obj["__const__"]]
    if "__array__" in obj:
        name = obj["dtype"]
        dtype = isa.DTYPES[name] if name in isa.DTYPES else np.dtype(name)
        raw = base64.b64decode(obj["__array__"])
        return np.frombuffer(raw, dtype=dtype).reshape(obj["shape"]).copy()
    if "__bytes__" in obj:
        return base64.b64decode(obj["__bytes__"])
    if "__enum__" in obj:
        return _allowed_class(obj["__enum__"])(obj["value"])
    if "__tuple__" in obj:
        return tuple(_decode(x, constants) for x in obj["__tuple__"])
    if "__frozenset__" in obj:
        return frozenset(_decode(x, constants) for x in obj["__frozenset__"])
    if "__dict__" in obj:
        return {_decode(k, constants): _decode(v, constants) for k, v in obj["__dict__"]}
    if "__dc__" in obj:
        cls = _allowed_class(obj["__dc__"])
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{obj['__dc__']} is not a dataclass")
        kwargs = {k: _decode(v, constants) for k, v in obj["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        inst: object = cls(**{k: v for k, v in kwargs.items() if k in init})
        for k, v in kwargs.items():
            if k not in init:
                object.__setattr__(inst, k, v)
        return inst
    return {k: _decode(v, constants) for k, v in obj.items()}


def _constants(graph: Graph) -> list[NDArray[Any]]:
    return [np.asarray(v.const) for v in graph.constants]


def dumps(plan: object, graph: Graph) -> bytes:
    """A plan as a framed, checksummed entry (constants of ``graph`` stored by reference)."""
    payload = zlib.compress(json.dumps(_Encoder(_constants(graph))(plan), separators=(",", ":"),
                                       allow_nan=True).encode(), 1)
    return _HEAD.pack(MAGIC, VERSION, hashlib.sha256(payload).digest()) + payload


class CorruptEntry(ValueError):
    """A cache entry that must not be loaded."""


def loads(data: bytes, graph: Graph) -> Any:
    """Inverse of :func:`dumps`; raises :class:`CorruptEntry` for any damage."""
    if len(data) < _HEAD.size:
        raise CorruptEntry(f"entry is {len(data)} bytes, shorter than its header")
    magic, version, digest = _HEAD.unpack_from(data)
    payload = data[_HEAD.size:]
    if magic != MAGIC:
        raise CorruptEntry(f"bad magic {magic!r}")
    if version != VERSION:
        raise CorruptEntry(f"entry format {version}, this fornax reads {VERSION}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("checksum mismatch: the entry is truncated or corrupt")
    try:
        return _decode(json.loads(zlib.decompress(payload)), _constants(graph))
    except Exception as exc:      # a well-framed entry this fornax cannot rebuild: not loaded
        raise CorruptEntry(f"unreadable entry: {type(exc).__name__}: {exc}") from None


class CompileCache(Generic[PlanT]):
    """Memory + disk levels for one compiler instance."""

    def __init__(self, directory: str | Path | None = None):
        self._directory = Path(directory) if directory is not None else None
        self.memory: dict[str, PlanT] = {}
        self.stats = {"memory_hits": 0, "disk_hits": 0, "misses": 0, "disk_writes": 0,
                      "corrupt": 0, "not_stored": 0, "bypassed": 0}
        self.last_problem = ""

    @property
    def directory(self) -> Path | None:
        """The disk level's folder (read at each use, so ``FORNAX_CACHE_DIR`` can change)."""
        return self._directory if self._directory is not None else default_directory()

    def path(self, key: str) -> Path | None:
        d = self.directory
        return None if d is None else d / "compile" / f"{key}.fxcc"

    def get(self, key: str, graph: Graph) -> PlanT | None:
        """The cached plan for ``key``, or ``None`` (a miss); a corrupt disk entry is deleted."""
        plan = self.memory.get(key)
        if plan is not None:
            self.stats["memory_hits"] += 1
            return plan
        path = self.path(key)
        if path is not None:
            try:
                data = path.read_bytes()
            except OSError:
                data = None
            if data is not None:
                try:
                    loaded: PlanT = loads(data, graph)    # a plan this cache's compiler stored
                except CorruptEntry as exc:
                    self.stats["corrupt"] += 1
                    self.last_problem = f"{path.name}: {exc}"
                    try:
                        path.unlink()
                    except OSError:
                        pass
                else:
                    self.stats["disk_hits"] += 1
                    self.memory[key] = loaded
                    return loaded
        self.stats["misses"] += 1
        return None

    def bypass(self) -> None:
        """Count a compile that skipped the lookup (the IR after each pass was asked for)."""
        self.stats["bypassed"] += 1

    def put(self, key: str, plan: PlanT, graph: Graph) -> None:
        self.memory[key] = plan
        path = self.path(key)
        if path is None:
            return
        try:
            data = dumps(plan, graph)
        except _Unserialisable as exc:
            self.stats["not_stored"] += 1
            self.last_problem = str(exc)
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)          # atomic: readers see the old entry or the new one
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as exc:                 # a read-only or full disk: the memory level still works
            self.stats["not_stored"] += 1
            self.last_problem = f"cannot write {path}: {exc.strerror or exc}"
            return
        self.stats["disk_writes"] += 1

    def report(self) -> dict[str, Any]:
        d = self.directory
        return {**self.stats, "directory": str(d) if d is not None else "off",
                **({"problem": self.last_problem} if self.last_problem else {})}
