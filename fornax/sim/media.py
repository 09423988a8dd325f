"""Fixed-function media (video decode) engines: the chip spec's ``[media]`` table and the
decode cost model.

A chip has one or more *kinds* of decode engine (NVDEC and NVJPG on a Hopper-like part,
VCN and its JPEG cores on an MI300X-like one, Xe media engines on a Max-1550-like one),
each with a count, the codecs it decodes, and per codec a throughput and the largest
frame it takes.  The timeline gets one engine per physical engine, ``media0`` ..
``mediaN`` in the spec's order of kinds, but only when a media queue is created
(:func:`engine_names`), so a run that decodes nothing has the same engines as before.

The cost model (:func:`decode_seconds`) is throughput-bound: a frame of ``width x
height`` pixels takes ``(width x height / 1920 x 1080) / fps_1080p`` seconds of its
engine, where ``fps_1080p`` is the spec's frames per second per engine for that codec
at 1080p.  A 4K frame (3840 x 2160, four times the pixels) takes four times a 1080p
one; bitstream size, entropy-coding load and B-frame structure are not modelled.
Simulated time only: the host's real decode (of the real bitstream) costs nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .faults import SpecError

#: the reference frame size the spec's throughputs are quoted at (1080p)
REFERENCE_PIXELS = 1920 * 1080

#: the fields of one engine kind's table: name -> description
ENGINE_FIELDS: dict[str, str] = {
    "count": "engines of this kind on the chip",
    "max_sessions": "decode sessions (decoders) all engines of this kind hold at once",
    "codecs": "codec name -> {fps_1080p, max_width, max_height}",
}

#: the fields of one codec's entry: name -> description
CODEC_FIELDS: dict[str, str] = {
    "fps_1080p": "frames per second one engine decodes at 1920 x 1080",
    "max_width": "widest frame in pixels",
    "max_height": "tallest frame in pixels",
}


@dataclass(frozen=True)
class CodecSpec:
    """What one engine kind does with one codec."""

    fps_1080p: float
    max_width: int
    max_height: int

    def to_dict(self) -> dict[str, Any]:
        return {"fps_1080p": self.fps_1080p, "max_width": self.max_width, "max_height": self.max_height}


@dataclass(frozen=True)
class MediaEngineSpec:
    """One kind of decode engine: how many, how many sessions, which codecs and how fast."""

    kind: str
    count: int
    max_sessions: int
    codecs: dict[str, CodecSpec]

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "max_sessions": self.max_sessions,
                "codecs": {name: c.to_dict() for name, c in self.codecs.items()}}


@dataclass(frozen=True)
class MediaSpec:
    """A chip's media engines (the spec's ``[media]`` table), kinds in the spec's order."""

    engines: tuple[MediaEngineSpec, ...]
    source: str = ""

    @property
    def codecs(self) -> list[str]:
        """Every codec some engine kind decodes, in the spec's order."""
        seen: dict[str, None] = {}
        for e in self.engines:
            seen.update(dict.fromkeys(e.codecs))
        return list(seen)

    def engine_for(self, codec: str) -> MediaEngineSpec | None:
        """The first engine kind that decodes ``codec`` (None: no engine does)."""
        return next((e for e in self.engines if codec in e.codecs), None)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "engines": {e.kind: e.to_dict() for e in self.engines}}


def engine_names(media: MediaSpec) -> list[tuple[str, str]]:
    """The timeline engine of every physical media engine, with its kind:
    ``[("media0", "nvdec"), ..., ("media7", "nvjpg"), ...]``."""
    out: list[tuple[str, str]] = []
    for e in media.engines:
        base = len(out)
        out.extend((f"media{base + i}", e.kind) for i in range(e.count))
    return out


def decode_seconds(codec: CodecSpec, width: int, height: int) -> float:
    """Simulated seconds one engine takes to decode a ``width x height`` frame of ``codec``:
    the frame's pixels relative to 1080p, over the engine's 1080p frame rate."""
    return (width * height / REFERENCE_PIXELS) / codec.fps_1080p


def _positive(where: str, key: str, value: Any, typ: type[Any]) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool) or value <= 0:
        raise SpecError(f"chip spec {where}: {key} must be a positive {typ.__name__}, got {value!r}")
    return value


def parse_media(data: Any, where: str) -> MediaSpec:
    """The typed ``[media]`` table of spec ``where`` (a SpecError naming the key otherwise)."""
    if not isinstance(data, dict):
        raise SpecError(f"chip spec {where}: [media] must be a table, got {type(data).__name__}")
    unknown = sorted(set(data) - {"source", "engines"})
    if unknown:
        raise SpecError(f"chip spec {where}: [media] has unknown field(s) {', '.join(unknown)} "
                        "(it takes source and [media.engines.KIND] tables)")
    source = data.get("source", "")
    if not isinstance(source, str):
        raise SpecError(f"chip spec {where}: media.source must be a string")
    engines = data.get("engines")
    if not isinstance(engines, dict) or not engines:
        raise SpecError(f"chip spec {where}: [media] needs at least one [media.engines.KIND] table "
                        f"({', '.join(f'{k}: {v}' for k, v in ENGINE_FIELDS.items())})")
    kinds = []
    for kind, table in engines.items():
        at = f"media.engines.{kind}"
        if not isinstance(table, dict):
            raise SpecError(f"chip spec {where}: [{at}] must be a table")
        missing = [k for k in ENGINE_FIELDS if k not in table]
        extra = sorted(set(table) - set(ENGINE_FIELDS))
        if missing or extra:
            raise SpecError(f"chip spec {where}: [{at}] "
                            + (f"is missing {', '.join(missing)}" if missing else
                               f"has unknown field(s) {', '.join(extra)}")
                            + f" (fields: {', '.join(ENGINE_FIELDS)})")
        codecs_table = table["codecs"]
        if not isinstance(codecs_table, dict) or not codecs_table:
            raise SpecError(f"chip spec {where}: {at}.codecs must name at least one codec")
        codecs = {}
        for name, entry in codecs_table.items():
            cat = f"{at}.codecs.{name}"
            if not isinstance(entry, dict) or set(entry) != set(CODEC_FIELDS):
                raise SpecError(f"chip spec {where}: {cat} must be a table of exactly "
                                f"{', '.join(CODEC_FIELDS)}, got {entry!r}")
            codecs[str(name)] = CodecSpec(_positive(where, f"{cat}.fps_1080p", entry["fps_1080p"], float),
                                          _positive(where, f"{cat}.max_width", entry["max_width"], int),
                                          _positive(where, f"{cat}.max_height", entry["max_height"], int))
        kinds.append(MediaEngineSpec(str(kind), _positive(where, f"{at}.count", table["count"], int),
                                     _positive(where, f"{at}.max_sessions", table["max_sessions"], int),
                                     codecs))
    return MediaSpec(tuple(kinds), source)
