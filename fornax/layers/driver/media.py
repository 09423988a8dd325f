"""Media queues: decode sessions on the chip's fixed-function video engines.

Each family exposes decode through its own API (the facts' ``[driver.media]`` table:
cuvid-style ``cuvidCreateDecoder``/``cuvidDecodePicture``, rocDecode's
``rocDecCreateDecoder``/``rocDecDecodeFrame``, oneVPL's ``MFXVideoDECODE_Init``/
``MFXVideoDECODE_DecodeFrameAsync``, and per codec another API where the real stack
uses one, such as nvJPEG or rocJPEG for JPEG); the policy is shared and lives here.

A :class:`MediaQueueBase` is one decode session (a decoder): created for one codec and
a largest frame size, bound to one physical engine of the kind that decodes that codec
(the one with the fewest sessions), with a hardware queue of its own on the device
timeline.  The engines join the timeline (``media0`` .. ``mediaN``) when the first
session on the device is created, so a run without media keeps its engines.

A decode is a packet: the bitstream is parsed and decoded on the host when
:meth:`MediaQueueBase.decode` is called (as the real parsers run on the host); the packet
writes the decoded frame (RGB, 8 bits per channel, row-major ``height x width x 3``)
into device memory when it runs, and takes the simulated time the chip spec gives
(:func:`fornax.sim.media.decode_seconds`), never host wall time.  It signals the
session's timeline semaphore like every other packet, so :meth:`record` gives a marker
another queue can wait on.

A codec the chip's engines lack, a frame larger than the engine takes, or more
sessions than the engine kind holds is the family's "not supported" driver error.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from ...sim.device import Device
from ...sim.faults import SimError
from ...sim.media import MediaEngineSpec, decode_seconds, engine_names
from ...sim.timeline import HardwareQueue, Packet, Semaphore
from ..errors import ConfigError, FornaxError, NotSupportedError
from .context import ContextRules
from .core import is_int
from .protocol import Context, MediaEngine, Marker

#: a host decoder: one compressed frame -> its pixels (``height x width x 3`` uint8, RGB)
HostDecoder = Callable[[bytes], NDArray[np.uint8]]


def decode_jpeg(data: bytes) -> NDArray[np.uint8]:
    """Decode one JPEG image (a motion-JPEG frame) to RGB pixels with Pillow."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "JPEG":
                raise ValueError(f"the bitstream is {img.format}, not JPEG")
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ValueError(f"not a decodable JPEG frame ({exc})") from None


#: the host decoders fornax has for the codecs it simulates (others take a caller's decoder)
HOST_DECODERS: dict[str, HostDecoder] = {"mjpeg": decode_jpeg}


class MediaQueueBase:
    """One decode session on one media engine (the :class:`~.protocol.MediaQueue` contract)."""

    flavour = "media"

    def __init__(self, driver: MediaRules, ctx: Context, codec: str, width: int, height: int,
                 engine: str, kind: MediaEngineSpec, host_decoder: HostDecoder | None):
        self.driver, self.ctx, self.codec = driver, ctx, codec
        self.width, self.height = width, height
        self.engine, self.kind = engine, kind.kind
        self._codec_spec = kind.codecs[codec]
        facts = driver.facts["driver"]["media"]
        entry = facts["codecs"][codec]
        #: how the family names this session: its API, the codec's name there, and its calls
        self.api: dict[str, str] = {"api": str(entry.get("api", facts["api"])), "codec": str(entry["name"]),
                                    **{what: driver.media_call(codec, what)
                                       for what in ("create", "decode", "destroy")}}
        self._host_decoder = host_decoder
        self.device: Device = ctx.device
        self.hwq: HardwareQueue = ctx.device.timeline.create_queue(
            f"{driver.vendor}:{self.flavour}:{codec}@{engine}")
        self.sem = Semaphore(f"{self.flavour}{self.hwq.id}")
        self.submitted = 0
        self.decoded = 0
        self.destroyed = False
        self._pending_waits: list[tuple[Semaphore, int]] = []

    def _call(self, what: str) -> str:
        return self.driver.media_call(self.codec, what)

    def _check(self, what: str) -> None:
        d = self.driver
        if self.destroyed:
            raise d.fail("invalid_handle", f"the {self.codec} decoder on {self.engine} was destroyed",
                         call=self._call(what), hint="create a new media queue")
        d.check(self.ctx, self._call(what))

    def decode(self, bitstream: bytes, dst: int) -> None:
        """Decode one compressed frame into ``dst`` (``height x width x 3`` bytes of device
        memory in this session's context), in queue order on this session's engine."""
        d, call = self.driver, self._call("decode")
        self._check("decode")
        if not isinstance(bitstream, (bytes, bytearray, memoryview)) or not len(bitstream):
            raise d.fail("invalid_value", "the bitstream must be non-empty bytes", call=call)
        decoder = self._host_decoder or HOST_DECODERS.get(self.codec)
        if decoder is None:
            raise d.media_unsupported(f"fornax has no host decoder for {self.codec} bitstreams", call,
                                      "pass host_decoder= to create_media_queue, or decode mjpeg")
        try:
            frame = np.ascontiguousarray(decoder(bytes(bitstream)), dtype=np.uint8)
        except ValueError as exc:
            raise d.fail("invalid_value", f"{self.codec} bitstream: {exc}", call=call) from None
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise d.fail("invalid_value", f"the decoded {self.codec} frame has shape {frame.shape}, "
                         "not height x width x 3", call=call)
        h, w = int(frame.shape[0]), int(frame.shape[1])
        if w > self.width or h > self.height:
            raise d.media_unsupported(f"a {w}x{h} frame is larger than the {self.width}x{self.height} "
                                      f"this {self.codec} decoder was created for", call,
                                      "create the decoder with the stream's largest frame size")
        nbytes = int(frame.nbytes)
        if not is_int(dst):
            raise d.fail("invalid_value", f"the destination must be a device address, got {dst!r}",
                         call=call)
        try:
            self.ctx.space.resolve(int(dst), nbytes, "media decode")
        except SimError as exc:
            raise d.fail("invalid_value", f"the {w}x{h} frame ({nbytes} bytes) does not fit at "
                         f"{int(dst):#x}: {exc}", call=call, address=int(dst)) from None
        seconds = decode_seconds(self._codec_spec, w, h)
        data = frame.reshape(-1)
        space, device, timeline = self.ctx.space, self.device, self.device.timeline
        label = f"decode {self.codec} {w}x{h}"
        engine, codec, context = self.engine, self.codec, self.ctx.handle

        def work() -> float:
            device.begin("media", label, context)        # a lost device fails the packet
            if not device.meta:
                space.write(int(dst), data, owned=True)
            timeline.annotate(writes=[(int(dst), int(dst) + nbytes, "frame")], bytes=nbytes,
                              codec=codec, width=w, height=h, media_engine=engine)
            return seconds

        value = self.submitted + 1
        waits, self._pending_waits = self._pending_waits, []
        self.hwq.submit(Packet(self.engine, work, label, "decode", waits=waits,
                               signals=[(self.sem, value)]))
        self.submitted = value
        self.decoded += 1
        d.media_counts["frames_decoded"] += 1
        d.media_counts["decoded_bytes"] += nbytes

    def record(self) -> Marker:
        """A marker reached once every decode submitted so far has landed."""
        return Marker(self.sem, self.submitted)

    def wait(self, marker: Marker) -> None:
        """Later decodes on this session start only after ``marker`` (of any queue)."""
        if not isinstance(marker, Marker):
            raise self.driver.fail("invalid_handle", f"expected a marker recorded on a queue, got "
                                   f"{type(marker).__name__}", call=self._call("decode"))
        self._pending_waits.append((marker.sem, marker.value))

    def synchronize(self) -> None:
        """The host waits for every decode submitted; a fault is the family's driver error."""
        self._check("decode")
        try:
            self.device.timeline.wait(self.sem, self.submitted)
        except SimError as exc:
            raise self.driver.fault(self.ctx, exc, "synchronize") from None


class MediaRules(ContextRules):
    """The driver's media calls: decode sessions per device, engines from the chip spec."""

    def __init__(self, devices: list[Device]):
        super().__init__(devices)
        #: decode statistics (sessions created, frames and bytes decoded); they only grow
        self.media_counts: dict[str, int] = {"sessions_created": 0, "frames_decoded": 0,
                                             "decoded_bytes": 0}
        self._media_sessions: list[MediaQueueBase] = []
        media = self.facts["driver"].get("media")
        if media is not None and media["unsupported"] not in self.errors.codes:
            raise ConfigError(f"{self.vendor} vendor.toml: [driver.media] unsupported names "
                              f"{media['unsupported']!r}, which is not in [errors.codes]",
                              seam="driver", vendor=self.vendor)

    @property
    def media_sessions(self) -> list[MediaQueueBase]:
        """The live decode sessions of every device (destroyed ones and dead contexts' leave)."""
        for s in self._media_sessions:
            if not s.ctx.live and not s.destroyed:      # its context was destroyed: so is it
                s.destroyed = True
                s.device.timeline.remove_queue(s.hwq)
        self._media_sessions[:] = [s for s in self._media_sessions if not s.destroyed]
        return self._media_sessions

    def _media_facts(self, call: str) -> dict[str, Any]:
        facts = self.facts["driver"].get("media")
        if facts is None:
            raise NotSupportedError(
                f"{self.facts['driver']['api']} exposes no video decode", seam="driver",
                vendor=self.vendor, op=call,
                hint="a family declares its decode API in vendor.toml [driver.media]")
        return cast(dict[str, Any], facts)

    def media_call(self, codec: str, what: str) -> str:
        """The family's API name for ``what`` (create, decode, destroy) on ``codec``."""
        facts = self.facts["driver"].get("media") or {}
        entry = facts.get("codecs", {}).get(codec, {})
        return str(entry.get(what) or facts.get("calls", {}).get(what, f"media {what}"))

    def media_unsupported(self, message: str, call: str, hint: str) -> FornaxError:
        """The family's "not supported" error for a decode request the engines cannot serve."""
        name = self._media_facts(call)["unsupported"]
        return self.errors.error(name, message, op=call, hint=hint)

    def media_engines(self, index: int) -> list[MediaEngine]:
        """Device ``index``'s media engines, one per physical engine (none where the chip
        spec has no ``[media]`` table)."""
        device = self._device(index, "media_engines")
        media = device.spec.media
        if media is None:
            return []
        facts = self.facts["driver"].get("media") or {}
        named = facts.get("codecs", {})
        kinds = {k.kind: k for k in media.engines}
        busy = [s.engine for s in self.media_sessions if s.device is device]
        return [MediaEngine(name, kind, tuple(c for c in kinds[kind].codecs if c in named),
                            kinds[kind].max_sessions, busy.count(name))
                for name, kind in engine_names(media)]

    def create_media_queue(self, ctx: Context | None, codec: str, width: int, height: int,
                           host_decoder: HostDecoder | None = None) -> MediaQueueBase:
        """A decode session for ``codec`` frames up to ``width x height`` on ``ctx``'s device."""
        facts = self._media_facts("create_media_queue")
        call = self.media_call(str(codec), "create")
        ctx = self.resolve_context(ctx, call)
        self.check(ctx, call)
        if not (is_int(width) and is_int(height) and int(width) > 0 and int(height) > 0):
            raise self.fail("invalid_value", f"a decoder needs a positive width and height, got "
                            f"{width!r} x {height!r}", call=call)
        width, height = int(width), int(height)
        device = ctx.device
        media = device.spec.media
        spoken = facts.get("codecs", {})
        if media is None:
            raise self.media_unsupported(f"chip {device.spec.name} has no media engines", call,
                                         "use a chip spec with a [media] table")
        kind = media.engine_for(codec) if codec in spoken else None
        if kind is None:
            offered = [c for c in media.codecs if c in spoken]
            raise self.media_unsupported(
                f"no media engine of {device.spec.name} decodes {codec!r} through "
                f"{facts['api']}", call, f"codecs it decodes: {', '.join(offered) or 'none'}")
        limit = kind.codecs[codec]
        if width > limit.max_width or height > limit.max_height:
            raise self.media_unsupported(
                f"{codec} frames of {width}x{height} exceed the {kind.kind} engine's "
                f"{limit.max_width}x{limit.max_height}", call, "decode a smaller resolution")
        mine = [s for s in self.media_sessions if s.device is device and s.kind == kind.kind]
        if len(mine) >= kind.max_sessions:
            raise self.media_unsupported(
                f"the {kind.kind} engines of device {self.devices.index(device)} already hold "
                f"{len(mine)} decode session(s), their most", call,
                f"destroy a session first ({self.media_call(codec, 'destroy')})")
        names = engine_names(media)
        for name, _ in names:                   # the engines join the timeline now
            device.timeline.add_engine(name)
        candidates = [name for name, k in names if k == kind.kind]
        load = {name: 0 for name in candidates}
        for s in mine:
            load[s.engine] += 1
        engine = min(candidates, key=lambda n: load[n])
        queue = MediaQueueBase(self, ctx, codec, width, height, engine, kind, host_decoder)
        self.media_sessions.append(queue)
        self.media_counts["sessions_created"] += 1
        return queue

    def destroy_media_queue(self, queue: object) -> None:
        """End a decode session: decodes already submitted still land; later use is an error."""
        if not isinstance(queue, MediaQueueBase) or queue.destroyed:
            raise self.fail("invalid_handle", "the media queue was already destroyed or is not one",
                            call="destroy_media_queue")
        queue.destroyed = True
        queue.device.timeline.remove_queue(queue.hwq)
