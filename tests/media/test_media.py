"""Media engines on the timeline: chip data, decode sessions per family, the video-to-tensor
pipeline, its trace and its CLI."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import FAMILIES

from fornax.cli.main import main
from fornax.layers.driver import Driver, MediaQueue
from fornax.layers.errors import FornaxError
from fornax.schemas import validate
from fornax.sim import media as sim_media
from fornax.sim.faults import SpecError
from fornax.sim.spec import available_specs, load_spec
from fornax.sim.trace import chrome_trace
from fornax.scenarios.media import encode_mjpeg, make_frames, run_media
from fornax.stack import compose, make_config

#: each family's exact "not supported" code (VENDORS.md; the families' [errors.codes])
UNSUPPORTED = {"cuda-like": ("CUDA_ERROR_NOT_SUPPORTED", 801),
               "rocm-like": ("hipErrorNotSupported", 801),
               "xpu-like": ("ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003)}
#: each family's decode calls for the codecs (vendor facts)
CREATE = {"cuda-like": {"h264": "cuvidCreateDecoder", "mjpeg": "nvjpegDecoderCreate"},
          "rocm-like": {"h264": "rocDecCreateDecoder", "mjpeg": "rocJpegCreate"},
          "xpu-like": {"h264": "MFXVideoDECODE_Init", "mjpeg": "MFXVideoDECODE_Init"}}
SPECS = Path(__file__).resolve().parents[2] / "fornax" / "sim" / "specs"


def _stack(family: str, spec: str = "tiny"):
    return compose(make_config(vendor=family, spec=spec))


def _fake_decoder(width: int, height: int):
    """A stand-in host decoder for a codec fornax cannot encode (H.264): a fixed frame."""
    frame = (np.arange(width * height * 3) % 251).astype(np.uint8).reshape(height, width, 3)
    return lambda data: frame


# -- chip data -------------------------------------------------------------------------------

def test_every_shipped_spec_has_media_engines_and_cites_its_source():
    counts = {}
    for name in available_specs():
        spec = load_spec(name)
        assert spec.media is not None and spec.media.source, name
        counts[name] = {e.kind: e.count for e in spec.media.engines}
    assert counts["h100-like"] == counts["h200-like"] == {"nvdec": 7, "nvjpg": 7}
    assert counts["mi300x-like"]["vcn"] == 4
    assert "xe-media" in counts["max1550-like"]
    text = (SPECS / "mi300x-like.toml").read_text()
    media = text[text.index("[media]"):]
    assert "estimate" in media and "white paper" in media


def test_a_spec_without_media_still_loads(tmp_path):
    text = (SPECS / "tiny.toml").read_text()
    old = tmp_path / "old.toml"
    old.write_text(text[:text.index("\n[media]")] + "\n")
    assert load_spec(old).media is None


@pytest.mark.parametrize("bad, fragment", [
    ("count = 0", "count must be a positive int"),
    ("bogus = 1", "unknown field"),
    ('h264 = { fps_1080p = 240.0, max_width = 4096 }', "exactly fps_1080p, max_width, max_height"),
])
def test_a_bad_media_table_is_a_spec_error_naming_the_key(tmp_path, bad, fragment):
    text = (SPECS / "tiny.toml").read_text()
    if bad.startswith("h264"):
        text = text.replace("h264 = { fps_1080p = 240.0, max_width = 4096, max_height = 4096 }", bad)
    elif bad.startswith("count"):
        text = text.replace("count = 2", bad)
    else:
        text = text.replace("max_sessions = 4", "max_sessions = 4\n" + bad)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match=fragment):
        load_spec(path)


def test_decode_time_scales_with_pixels_from_the_spec():
    codec = load_spec("tiny").media.engines[0].codecs["h264"]
    hd = sim_media.decode_seconds(codec, 1920, 1080)
    assert hd == pytest.approx(1 / 240)
    assert sim_media.decode_seconds(codec, 3840, 2160) == pytest.approx(4 * hd)


def test_specs_json_carries_the_media_table():
    r = CliRunner().invoke(main, ["specs", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate(doc)
    h100 = next(s for s in doc["specs"] if s["name"] == "h100-like")
    assert h100["media"]["engines"]["nvdec"]["count"] == 7


# -- the driver seam ------------------------------------------------------------------------

def test_media_engines_join_the_timeline_only_with_a_media_queue():
    stack = _stack("cuda-like")
    timeline = stack.devices[0].timeline
    before = list(timeline.engines)
    assert not any(e.startswith("media") for e in before)
    engines = stack.driver.media_engines(0)
    assert [e.name for e in engines] == ["media0", "media1"]
    assert not any(e.startswith("media") for e in timeline.engines)
    q = stack.driver.create_media_queue(stack.runtime.context(0), "mjpeg", 64, 48)
    assert isinstance(q, MediaQueue) and isinstance(stack.driver, Driver)
    assert list(timeline.engines) == before + ["media0", "media1"]
    stack.driver.destroy_media_queue(q)


@pytest.mark.parametrize("family", FAMILIES)
def test_decoded_frames_equal_pillows_bit_for_bit(family):
    from PIL import Image
    import io

    stack = _stack(family)
    runtime, driver = stack.runtime, stack.driver
    frames = make_frames(5, 64, 48, seed=3)
    streams = encode_mjpeg(frames)
    q = driver.create_media_queue(runtime.context(0), "mjpeg", 64, 48)
    assert q.api["create"] == CREATE[family]["mjpeg"]
    ptrs = [runtime.malloc(64 * 48 * 3) for _ in streams]
    for data, ptr in zip(streams, ptrs):
        q.decode(data, ptr)
    q.synchronize()
    for data, ptr in zip(streams, ptrs):
        got = np.zeros(64 * 48 * 3, np.uint8)
        runtime.memcpy_d2h(got, ptr)
        runtime.synchronize()
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(got.reshape(48, 64, 3), want)
    records = [r for r in stack.devices[0].timeline.records if r.kind == "decode"]
    assert len(records) == 5 and {r.engine for r in records} == {q.engine}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("codec, size, why", [
    ("vp9", (64, 48), "decodes 'vp9'"),
    ("h264", (8192, 8192), "exceed"),
    ("mjpeg", (8192, 64), "exceed"),
])
def test_unsupported_decode_is_the_familys_exact_code(family, codec, size, why):
    stack = _stack(family)
    with pytest.raises(FornaxError) as info:
        stack.driver.create_media_queue(stack.runtime.context(0), codec, *size)
    name, value = UNSUPPORTED[family]
    assert info.value.code.name == name and info.value.code.value == value
    assert why in info.value.message and info.value.vendor == family and info.value.seam == "driver"


@pytest.mark.parametrize("family", FAMILIES)
def test_too_many_sessions_is_the_familys_exact_code(family):
    stack = _stack(family)
    ctx = stack.runtime.context(0)
    limit = load_spec("tiny").media.engines[0].max_sessions
    sessions = [stack.driver.create_media_queue(ctx, "h264", 64, 48) for _ in range(limit)]
    with pytest.raises(FornaxError) as info:
        stack.driver.create_media_queue(ctx, "h264", 64, 48)
    assert info.value.code.name == UNSUPPORTED[family][0]
    assert info.value.op == CREATE[family]["h264"]
    stack.driver.destroy_media_queue(sessions[0])          # a freed session can be taken again
    stack.driver.destroy_media_queue(stack.driver.create_media_queue(ctx, "h264", 64, 48))
    with pytest.raises(FornaxError, match="destroyed"):
        sessions[0].decode(b"x", 0)


def test_destroying_the_context_ends_its_sessions():
    stack = _stack("xpu-like")
    driver = stack.driver
    ctx = driver.create_context(0)
    q = driver.create_media_queue(ctx, "mjpeg", 64, 48)
    assert [e.sessions for e in driver.media_engines(0)] == [1, 0]
    driver.destroy_context(ctx)
    assert [e.sessions for e in driver.media_engines(0)] == [0, 0]
    assert q.destroyed and q.hwq not in stack.devices[0].timeline.queues


@pytest.mark.parametrize("family", FAMILIES)
def test_a_4k_h264_frame_takes_four_times_a_1080p_one(family):
    stack = _stack(family)
    runtime, driver = stack.runtime, stack.driver
    took = {}
    for w, h in ((1920, 1080), (3840, 2160)):
        q = driver.create_media_queue(runtime.context(0), "h264", w, h, host_decoder=_fake_decoder(w, h))
        ptr = runtime.malloc(w * h * 3)
        q.decode(b"\x00\x00\x01", ptr)
        q.synchronize()
        rec = [r for r in stack.devices[0].timeline.records if r.kind == "decode"][-1]
        took[w] = rec.end - rec.start
        runtime.free(ptr)
        driver.destroy_media_queue(q)
    assert took[1920] == pytest.approx(1 / 240)
    assert took[3840] == pytest.approx(4 * took[1920])


def test_a_bad_bitstream_is_invalid_value():
    stack = _stack("rocm-like")
    q = stack.driver.create_media_queue(stack.runtime.context(0), "mjpeg", 64, 48)
    with pytest.raises(FornaxError, match="not a decodable JPEG") as info:
        q.decode(b"not a jpeg", stack.runtime.malloc(64 * 48 * 3))
    assert info.value.code.name == "hipErrorInvalidValue"


def test_the_null_template_names_the_media_hooks():
    from fornax.vendors.null.driver import NullDriver

    d = NullDriver([])
    for call in (lambda: d.media_engines(0), lambda: d.create_media_queue(None, "h264", 64, 48),
                 lambda: d.destroy_media_queue(None)):
        with pytest.raises(FornaxError, match="not implemented: driver"):
            call()


def test_vendor_facts_name_each_familys_decode_api():
    from fornax.vendors.facts_loader import check_facts

    root = SPECS.parent.parent / "vendors"
    apis = {}
    for pkg in ("cuda_like", "rocm_like", "xpu_like"):
        facts = tomllib.loads((root / pkg / "vendor.toml").read_text())
        apis[pkg] = facts["driver"]["media"]["calls"]["decode"]
        facts["driver"]["media"]["calls"]["bogus"] = "x"
        with pytest.raises(FornaxError, match="media"):
            check_facts(facts)
    assert apis == {"cuda_like": "cuvidDecodePicture", "rocm_like": "rocDecDecodeFrame",
                    "xpu_like": "MFXVideoDECODE_DecodeFrameAsync"}


# -- the pipeline ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_the_pipeline_decodes_on_media_and_runs_the_cnn_on_compute_overlapped(family):
    report, stack = run_media(family, frames=8)
    validate(report)
    assert report["frames_match_pillow"] and report["frames_checked"] == 4
    assert report["numerics"]["ok"], report["numerics"]
    assert report["races"] == 0
    records = stack.devices[0].timeline.records
    decodes = [r for r in records if r.kind == "decode"]
    kernels = [r for r in records if r.engine == "compute" and r.kind == "kernel"]
    assert len(decodes) == 8 and {r.engine for r in decodes} == {"media0", "media1"}
    assert kernels
    # the CNN of a frame starts after its decode landed; decodes overlap compute
    overlapping = [d for d in decodes if any(k.start < d.end and d.start < k.end for k in kernels)]
    assert overlapping and report["overlap_s"] > 0
    first_kernel = min(k.start for k in kernels if k.start >= decodes[0].start)
    assert first_kernel >= min(d.end for d in decodes)
    assert report["frames_per_s"] == pytest.approx(8 / report["simulated_s"])


def _slow_spec(tmp_path: Path, engines: int) -> str:
    """A tiny spec whose JPEG engines are slow enough that decode bounds the pipeline."""
    text = (SPECS / "tiny.toml").read_text()
    text = text.replace("count = 2", f"count = {engines}").replace("max_sessions = 4", "max_sessions = 16")
    text = text.replace("mjpeg = { fps_1080p = 120.0", "mjpeg = { fps_1080p = 0.5")
    path = tmp_path / f"slow{engines}.toml"
    path.write_text(text)
    return str(path)


def test_frames_per_second_follows_the_spec(tmp_path):
    two, _ = run_media("cuda-like", spec=_slow_spec(tmp_path, 2), frames=8)
    four, _ = run_media("cuda-like", spec=_slow_spec(tmp_path, 4), frames=8)
    assert two["bottleneck"] == "media" and four["sessions"] == 4
    assert four["frames_per_s"] > 1.8 * two["frames_per_s"]
    per_frame = (64 * 48 / (1920 * 1080)) / 0.5
    assert two["decode_s_per_frame"] == pytest.approx(per_frame)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_trace_has_the_media_tracks(family):
    _, stack = run_media(family, frames=4)
    events = chrome_trace(stack.devices)["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"engine media0", "engine media1", "engine compute"} <= names
    tids = {e["args"]["name"]: e["tid"] for e in events if e.get("name") == "thread_name"}
    decode_events = [e for e in events if e.get("ph") == "X" and e.get("cat") == "decode"]
    assert {e["tid"] for e in decode_events} >= {tids["engine media0"], tids["engine media1"]}
    assert all(e["args"]["codec"] == "mjpeg" for e in decode_events)


def test_the_cli_json_validates_and_writes_a_trace(tmp_path):
    trace = tmp_path / "media.json"
    r = CliRunner().invoke(main, ["media", "--vendor", "xpu-like", "--frames", "6", "--json",
                                  "--trace", str(trace)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate(doc)
    assert doc["decode_api"]["decode"] == "MFXVideoDECODE_DecodeFrameAsync"
    assert any(e.get("cat") == "decode" for e in json.loads(trace.read_text())["traceEvents"])
    table = CliRunner().invoke(main, ["media", "--frames", "2"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "bottleneck" in table.output and "media0" in table.output


@pytest.mark.parametrize("args, fragment", [
    (["--resolution", "64by48"], "--resolution takes WIDTHxHEIGHT"),
    (["--resolution", "66x48"], "multiples of 4"),
    (["--frames", "0"], "--frames must be at least 1"),
    (["--vendor", "nope"], "nope"),
    (["--resolution", "8192x8192"], "CUDA_ERROR_NOT_SUPPORTED"),
])
def test_cli_bad_input_is_one_line(args, fragment):
    r = CliRunner().invoke(main, ["media", *args])
    assert r.exit_code != 0 and fragment in r.output, r.output
    assert "Traceback" not in r.output
