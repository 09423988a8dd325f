"""Video to tensor: frames decoded on the media engines feed a CNN on the compute engine.

The pipeline, on one device's timeline:

1. the host draws ``frames`` RGB frames (numpy: moving colour gradients, a bouncing
   square and a circle, all from one seed) and encodes each as a JPEG with Pillow
   (motion-JPEG: every frame is a JPEG of its own; nothing is downloaded);
2. per frame, a *decode packet* on a media queue (one decode session per media engine of
   the kind that decodes the codec, frames dealt round-robin): the host decodes the JPEG
   with Pillow for the real pixels, and the packet lands them in a device frame buffer,
   taking the engine's simulated time from the chip spec;
3. the compute stream waits on that decode's completion (a timeline-semaphore marker of
   the media queue), then runs the CNN: a graph compiled once into a resident plan
   (:meth:`fornax.layers.framework.FrameworkBase.prepare`).  Its first ops unpack the
   frame's bytes (the graph IR has no 8-bit type, so the plan reads the buffer as
   little-endian 32-bit words and splits each into four bytes), scale them to
   ``[-0.5, 0.5]``, then two 3x3 stride-2 convolutions with ReLU, a global average pool
   and a linear head give ``classes`` logits;
4. ``2 x sessions`` frame buffers are in flight, so the engines decode frame ``i + 1``
   (and more) while the compute engine runs the CNN on frame ``i``; a decode into a
   buffer waits for the CNN that last read it.

The report (:func:`run_media`, a JSON-serialisable dict, ``fornax.media/1``) gives the
simulated frames per second, each engine's busy time and utilisation, the bottleneck
(the busiest of media, copy and compute relative to the makespan), the time media and
compute were both busy, and the CNN's outputs against the same CNN in numpy (float64)
on the frames Pillow decoded.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..layers.driver import Marker, MediaQueue, decode_jpeg
from ..layers.errors import ConfigError
from ..layers.graph import DType, Graph, Value
from ..layers.runtime.handles import Event
from ..sim.timeline import Record
from ..stack import Stack, compose, make_config

SCHEMA = "fornax.media/1"
#: the one codec fornax can encode on the host (Pillow writes JPEG)
HOST_CODECS = ("mjpeg",)
#: max relative error (normwise) of the device CNN against the float64 numpy CNN
TOLERANCE = 1e-4


@dataclass(frozen=True)
class CNN:
    """The small classifier's weights (float32): two 3x3 stride-2 convolutions, a head."""

    w1: NDArray[np.float32]          # (c1, 3, 3, 3)
    b1: NDArray[np.float32]          # (c1,)
    w2: NDArray[np.float32]          # (c2, c1, 3, 3)
    b2: NDArray[np.float32]          # (c2,)
    wh: NDArray[np.float32]          # (c2, classes)
    bh: NDArray[np.float32]          # (classes,)

    @classmethod
    def make(cls, seed: int, c1: int = 8, c2: int = 16, classes: int = 10) -> CNN:
        rng = np.random.default_rng(seed + 1)

        def init(shape: tuple[int, ...], fan_in: int) -> NDArray[np.float32]:
            bound = 1.0 / np.sqrt(fan_in)
            return rng.uniform(-bound, bound, size=shape).astype(np.float32)

        return cls(init((c1, 3, 3, 3), 27), init((c1,), 27), init((c2, c1, 3, 3), 9 * c1),
                   init((c2,), 9 * c1), init((c2, classes), c2), init((classes,), c2))


def make_frames(count: int, width: int, height: int, seed: int = 0) -> list[NDArray[np.uint8]]:
    """``count`` RGB frames (``height x width x 3`` uint8): drifting colour gradients, a
    bouncing square and a circle moving along a path, all drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    phase = rng.uniform(0, 2 * np.pi, size=3)
    speed = rng.uniform(0.05, 0.2, size=3)
    side = max(2, min(width, height) // 4)
    pos = rng.uniform(0, 1, size=2) * [width - side, height - side]
    vel = rng.uniform(1, 3, size=2) * max(1, min(width, height) // 32)
    radius = max(2, min(width, height) // 6)
    frames = []
    for t in range(count):
        img = np.empty((height, width, 3), dtype=np.float64)
        img[..., 0] = 127 + 120 * np.sin(2 * np.pi * xx / width + phase[0] + speed[0] * t)
        img[..., 1] = 127 + 120 * np.sin(2 * np.pi * yy / height + phase[1] + speed[1] * t)
        img[..., 2] = 127 + 120 * np.sin(2 * np.pi * (xx + yy) / (width + height) + phase[2] + speed[2] * t)
        for axis, limit in ((0, width - side), (1, height - side)):      # bounce off the edges
            pos[axis] += vel[axis]
            if not 0 <= pos[axis] <= limit:
                vel[axis] = -vel[axis]
                pos[axis] = min(max(pos[axis], 0), limit)
        x0, y0 = int(pos[0]), int(pos[1])
        img[y0:y0 + side, x0:x0 + side] = (240, 30, 30)
        cx = width / 2 + width / 3 * np.cos(0.3 * t + phase[0])
        cy = height / 2 + height / 3 * np.sin(0.3 * t + phase[1])
        img[(xx - cx) ** 2 + (yy - cy) ** 2 <= radius ** 2] = (20, 20, 220)
        frames.append(np.clip(np.rint(img), 0, 255).astype(np.uint8))
    return frames


def encode_mjpeg(frames: list[NDArray[np.uint8]], quality: int = 90) -> list[bytes]:
    """Each frame as a baseline JPEG (Pillow): a motion-JPEG stream, one image per frame."""
    from PIL import Image

    out = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame, "RGB").save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def cnn_graph(width: int, height: int, cnn: CNN) -> Graph:
    """The CNN as a graph over one frame buffer read as int32 words (``height*width*3/4``)."""
    g = Graph("media-cnn")
    n = height * width * 3 // 4
    words = g.input("frame", (n,), DType.INT32)
    planes: list[Value] = []
    for k in range(4):                  # byte k of each little-endian word
        shifted = g.op("floor_divide", words, g.constant(np.array(256 ** k, np.int32), f"shift{k}"))
        byte = g.op("bitwise_and", shifted, g.constant(np.array(255, np.int32), "mask"))
        planes.append(g.op("reshape", byte, shape=(n, 1)))
    pixels = g.op("reshape", g.op("concat", *planes, axis=1), shape=(height, width, 3))
    x = g.op("cast", pixels, dtype="float32")
    x = g.op("sub", g.op("mul", x, g.constant(np.array(1 / 255, np.float32), "scale")),
             g.constant(np.array(0.5, np.float32), "centre"))
    x = g.op("reshape", g.op("transpose", x, perm=(2, 0, 1)), shape=(1, 3, height, width))
    for i, (w, b) in enumerate(((cnn.w1, cnn.b1), (cnn.w2, cnn.b2)), 1):
        x = g.op("convolution", x, g.constant(w, f"w{i}"), stride=2, padding=1)
        x = g.op("relu", g.op("add", x, g.constant(b.reshape(1, -1, 1, 1), f"b{i}")))
    c2 = cnn.w2.shape[0]
    pooled = g.op("reduce_mean", g.op("reshape", x, shape=(1, c2, -1)), axis=-1, keepdims=False)
    logits = g.op("add", g.op("matmul", pooled, g.constant(cnn.wh, "wh")), g.constant(cnn.bh, "bh"))
    g.output(logits, names=["logits"])
    return g


def _conv_numpy(x: NDArray[np.float64], w: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """A 3x3 stride-2 pad-1 convolution (CHW in, CHW out) in float64 numpy."""
    c, h, wd = x.shape
    p = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    oh, ow = (h - 1) // 2 + 1, (wd - 1) // 2 + 1
    cols = np.stack([p[:, i:i + 2 * oh:2, j:j + 2 * ow:2] for i in range(3) for j in range(3)], axis=1)
    out = np.einsum("ock,ckhw->ohw", w.reshape(w.shape[0], c, 9), cols)
    return out + b[:, None, None]


def cnn_numpy(frame: NDArray[np.uint8], cnn: CNN) -> NDArray[np.float64]:
    """The same CNN on the CPU in float64 numpy: the reference the device's logits meet."""
    x = frame.astype(np.float64).transpose(2, 0, 1) / 255 - 0.5
    for w, b in ((cnn.w1, cnn.b1), (cnn.w2, cnn.b2)):
        x = np.maximum(_conv_numpy(x, w.astype(np.float64), b.astype(np.float64)), 0.0)
    pooled = x.reshape(x.shape[0], -1).mean(axis=1)
    out: NDArray[np.float64] = pooled @ cnn.wh.astype(np.float64) + cnn.bh.astype(np.float64)
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted intervals covering ``spans``."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in spans)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds covered by both disjoint sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def engine_usage(records: list[Record], since: float = 0.0) -> dict[str, Any]:
    """Busy time per engine of the records that started at or after ``since``, the makespan
    from ``since`` to the last end, and the time media and compute engines were both busy."""
    mine = [r for r in records if r.start >= since]
    end = max((r.end for r in mine), default=since)
    makespan = end - since
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in mine:
        spans.setdefault(r.engine, []).append((r.start, r.end))
    busy = {e: _length(_union(s)) for e, s in sorted(spans.items())}
    media = _union([iv for e, s in spans.items() if e.startswith("media") for iv in s])
    compute = _union(spans.get("compute", []))
    return {"makespan_s": makespan, "busy_s": busy,
            "media_busy_s": _length(media), "compute_busy_s": _length(compute),
            "overlap_s": _intersection(media, compute)}


def _checked(width: int, height: int, frames: int, codec: str) -> None:
    if codec not in HOST_CODECS:
        raise ConfigError(f"the media scenario encodes frames on the host with Pillow, which writes "
                          f"{', '.join(HOST_CODECS)} only; got --codec {codec!r}",
                          hint="use --codec mjpeg (other codecs are priced by the spec, "
                               "see fornax.sim.media.decode_seconds)")
    if frames < 1:
        raise ConfigError(f"--frames must be at least 1, got {frames}")
    if width < 8 or height < 8 or width % 4 or height % 4:
        raise ConfigError(f"--resolution {width}x{height}: width and height must be multiples of 4 "
                          "and at least 8 (the CNN reads each frame as 32-bit words)",
                          hint="e.g. --resolution 64x48")


def parse_resolution(text: str) -> tuple[int, int]:
    """``"WxH"`` -> ``(W, H)`` (a ConfigError naming the flag otherwise)."""
    w, sep, h = str(text).lower().partition("x")
    if not sep or not w.strip().isdigit() or not h.strip().isdigit():
        raise ConfigError(f"--resolution takes WIDTHxHEIGHT, got {text!r}", hint="e.g. --resolution 64x48")
    return int(w), int(h)


def run_media(vendor: str = "cuda-like", spec: str = "tiny", frames: int = 8, width: int = 64,
              height: int = 48, codec: str = "mjpeg", seed: int = 0, quality: int = 90,
              stack: Stack | None = None) -> tuple[dict[str, Any], Stack]:
    """Run the video-to-tensor pipeline; returns the report (``fornax.media/1``) and the stack
    (its device's timeline holds the decode and CNN packets, for a trace)."""
    _checked(width, height, frames, codec)
    wall0 = time.perf_counter()
    if stack is None:
        stack = compose(make_config(vendor=vendor, spec=spec, seed=seed))
    driver, runtime, framework = stack.driver, stack.runtime, stack.framework
    cnn = CNN.make(seed)
    graph = cnn_graph(width, height, cnn)
    route = framework.device_route(graph)
    if route is not None:
        raise ConfigError(f"the media CNN cannot run whole on the device: {route.reason}",
                          seam="framework", vendor=framework.vendor)
    ctx = runtime.context(0)
    # the first session tells the engine kind that decodes the codec (or raises the family's
    # not-supported error); one session per engine of that kind, within its session limit
    first = driver.create_media_queue(ctx, codec, width, height)
    kind = first.kind
    engines = [e for e in driver.media_engines(0) if e.kind == kind]
    wanted = min(len(engines), engines[0].max_sessions, frames)
    sessions: list[MediaQueue] = [first, *(driver.create_media_queue(ctx, codec, width, height)
                                            for _ in range(wanted - 1))]
    host = make_frames(frames, width, height, seed)
    bitstreams = encode_mjpeg(host, quality)
    reference_frames = [decode_jpeg(b) for b in bitstreams]      # what Pillow decodes on the host
    stream = runtime.create_stream(in_order=True)
    plan = framework.prepare(graph, stream)
    frame_bytes = width * height * 3
    slots = min(frames, 2 * len(sessions))
    buffers = [runtime.malloc(frame_bytes) for _ in range(slots)]
    classes = cnn.wh.shape[1]
    outputs = [runtime.malloc(classes * 4) for _ in range(frames)]
    runtime.synchronize()               # the constants are uploaded: the pipeline starts here
    timeline = ctx.device.timeline
    start = max(timeline.host_time, timeline.busy_time)
    last_read: list[Marker | None] = [None] * slots
    for i, bitstream in enumerate(bitstreams):
        slot, session = i % slots, sessions[i % len(sessions)]
        before = last_read[slot]
        if before is not None:
            session.wait(before)        # the CNN that read this buffer last is done with it
        session.decode(bitstream, buffers[slot])
        decoded = Event(False, (session.record(),), None, 0.0, True)
        runtime.stream_wait_event(stream, decoded)
        plan([buffers[slot]], [outputs[i]], stream)
        last_read[slot] = runtime.record_event(stream).markers[-1]
    results = np.zeros((frames, classes), dtype=np.float32)
    for i, ptr in enumerate(outputs):
        runtime.memcpy_d2h(results[i], ptr, stream)
    runtime.stream_synchronize(stream)
    for session in sessions:
        session.synchronize()
    end = timeline.busy_time                    # the pipeline ends here (checks come after)

    device_frames = []
    for slot in range(min(slots, frames)):      # the last frame each buffer held
        got = np.zeros(frame_bytes, dtype=np.uint8)
        runtime.memcpy_d2h(got, buffers[slot], stream)
        device_frames.append(got)
    runtime.stream_synchronize(stream)
    last_in_slot = {i % slots: i for i in range(frames)}
    frames_match = all(np.array_equal(device_frames[s].reshape(height, width, 3), reference_frames[i])
                       for s, i in last_in_slot.items())

    refs = np.stack([cnn_numpy(f, cnn) for f in reference_frames])
    err = np.abs(results.astype(np.float64) - refs)
    scale = float(np.abs(refs).max()) or 1.0
    max_rel = float(err.max()) / scale

    records = [r for r in timeline.records if r.start >= start and r.end <= end]
    decodes = [r for r in records if r.kind == "decode"]
    kernels = [r for r in records if r.engine == "compute"]
    usage = engine_usage(records, start)
    makespan = usage["makespan_s"]
    media_names = sorted({e.name for e in engines}, key=lambda n: int(n[5:]))
    busy = usage["busy_s"]
    rows = []
    for e in media_names:
        rows.append({"engine": e, "kind": kind, "busy_s": busy.get(e, 0.0)})
    copies = sorted(e for e in timeline.engines if e.startswith("copy"))
    for e in copies:
        rows.append({"engine": e, "kind": "copy", "busy_s": busy.get(e, 0.0)})
    rows.append({"engine": "compute", "kind": "compute", "busy_s": busy.get("compute", 0.0)})
    for row in rows:
        row["utilisation"] = min(1.0, row["busy_s"] / makespan) if makespan > 0 else 0.0
    used = {session.engine for session in sessions}          # the engines with a session
    media_share = sum(busy.get(e, 0.0) for e in used) / (len(used) * makespan) if makespan > 0 else 0.0
    groups = {"media": min(1.0, media_share),
              "copy": max((r["utilisation"] for r in rows if r["kind"] == "copy"), default=0.0),
              "compute": next(r["utilisation"] for r in rows if r["engine"] == "compute")}
    bottleneck = max(groups, key=lambda k: groups[k])
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "vendor": driver.vendor,
        "spec": stack.spec.name,
        "codec": codec,
        "decode_api": dict(sessions[0].api),
        "frames": frames,
        "resolution": [width, height],
        "bitstream_bytes": sum(len(b) for b in bitstreams),
        "sessions": len(sessions),
        "frames_in_flight": slots,
        "simulated_s": makespan,
        "frames_per_s": frames / makespan if makespan > 0 else 0.0,
        "decode_s_per_frame": decodes[0].end - decodes[0].start if decodes else 0.0,
        "cnn_s_per_frame": _length(_union([(r.start, r.end) for r in kernels])) / frames,
        "engines": rows,
        "utilisation": groups,
        "bottleneck": bottleneck,
        "overlap_s": usage["overlap_s"],
        "media_busy_s": usage["media_busy_s"],
        "compute_busy_s": usage["compute_busy_s"],
        "frames_match_pillow": frames_match,
        "frames_checked": len(last_in_slot),
        "numerics": {"max_abs_err": float(err.max()), "max_rel_err": max_rel, "tol": TOLERANCE,
                     "ok": bool(np.isfinite(results).all()) and max_rel <= TOLERANCE},
        "races": len(timeline.races),
        "host_wall_s": time.perf_counter() - wall0,
    }
    for session in sessions:
        driver.destroy_media_queue(session)
    for ptr in [*buffers, *outputs]:
        runtime.free(ptr)
    plan.release()
    runtime.destroy_stream(stream)
    return report, stack
