"""Peer access and peer copies across 8 simulated devices, per vendor family.

Expected codes are the families' public values, written out by hand:
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED / hipErrorPeerAccessAlreadyEnabled = 704,
..._NOT_ENABLED = 705, ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from helpers import scale_program
from fornax.cli.main import main
from fornax.layers.compiler import Target
from fornax.layers.errors import ConfigError, FornaxError, NotSupportedError
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.sim.topology import Topology
from fornax.stack import compose, make_config
from fornax.stack import get_vendor

N = 8
API = {"cuda-like": "CUresult", "rocm-like": "hipError_t", "xpu-like": "ze_result_t"}
ALREADY = {"cuda-like": ("CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 704),
           "rocm-like": ("hipErrorPeerAccessAlreadyEnabled", 704)}
NOT_ENABLED = {"cuda-like": ("CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", 705),
               "rocm-like": ("hipErrorPeerAccessNotEnabled", 705)}
UNSUPPORTED = {"cuda-like": ("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 217),
               "rocm-like": ("hipErrorPeerAccessUnsupported", 217)}
ILLEGAL = {"cuda-like": ("CUDA_ERROR_ILLEGAL_ADDRESS", 700),
           "rocm-like": ("hipErrorIllegalAddress", 700),
           "xpu-like": ("ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001)}
EXPLICIT = ("cuda-like", "rocm-like")


def assert_code(err: FornaxError, vendor: str, name: str, value: int) -> None:
    assert err.code is not None, str(err)
    assert (err.code.api, err.code.name, err.code.value) == (API[vendor], name, value), str(err)


def make_driver(vendor: str, kind: str | None = "switch", devices: int = N):
    spec = load_spec("tiny")
    devs = [Device(spec, i) for i in range(devices)]
    if kind is not None:
        Topology.build(spec, devices, kind).connect(devs)
    return get_vendor(vendor).driver(devs)


def triple_program() -> isa.Program:
    """dst[i] = src[i] * 3 for i < 64."""
    return scale_program()


def load_triple(vendor, drv, ctx):
    comp = get_vendor(vendor).compiler()
    props = drv.properties(0)
    fmt = next(f for f in comp.output_formats() if f in drv.loadable_formats(0))
    return drv.load_module(ctx, comp.emit([triple_program()],
                                          Target(props.target, fmt, props.compute_units)))


def remote_read(vendor, drv, ctx0, ctx1):
    """A kernel on device 0 reads 64 floats mapped on device 1 and writes them x3 locally."""
    x = np.arange(64, dtype=np.float32) - 10          # x3 is exact in float32
    remote = drv.allocate(ctx1, x.nbytes)
    q1 = drv.create_queue(ctx1)
    q1.copy_h2d(remote, x)
    q1.synchronize()
    local = drv.allocate(ctx0, x.nbytes)
    q0 = drv.create_queue(ctx0)
    q0.launch(load_triple(vendor, drv, ctx0), "triple", (1, 1, 1), {"src": remote, "dst": local})
    out = np.zeros(64, np.float32)
    q0.copy_d2h(out, local)
    q0.synchronize()
    return x, out, remote


# -- query ------------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", API)
def test_can_access_peer_follows_the_fabric(vendor):
    drv = make_driver(vendor)
    assert drv.can_access_peer(0, 5) and drv.can_access_peer(5, 0)
    assert not drv.can_access_peer(3, 3)
    alone = make_driver(vendor, kind=None, devices=2)      # two devices, no fabric
    assert not alone.can_access_peer(0, 1)


# -- explicit enable (cuda-like, rocm-like) ------------------------------------------------------
@pytest.mark.parametrize("vendor", EXPLICIT)
def test_remote_read_faults_until_peer_access_is_enabled(vendor):
    drv = make_driver(vendor)
    ctx0, ctx1 = drv.create_context(0), drv.create_context(1)
    with pytest.raises(FornaxError) as err:
        remote_read(vendor, drv, ctx0, ctx1)
    assert_code(err.value, vendor, *ILLEGAL[vendor])
    assert "belongs to device 1" in str(err.value) and "no peer access" in str(err.value)

    drv2 = make_driver(vendor)
    c0, c1 = drv2.create_context(0), drv2.create_context(1)
    drv2.enable_peer_access(c0, c1)
    x, out, _ = remote_read(vendor, drv2, c0, c1)
    np.testing.assert_array_equal(out.astype(np.float64), x.astype(np.float64) * 3)


@pytest.mark.parametrize("vendor", EXPLICIT)
def test_enable_is_per_direction_and_twice_is_704(vendor):
    drv = make_driver(vendor)
    ctx0, ctx1 = drv.create_context(0), drv.create_context(1)
    drv.enable_peer_access(ctx0, ctx1)
    with pytest.raises(FornaxError) as err:
        drv.enable_peer_access(ctx0, ctx1)
    assert_code(err.value, vendor, *ALREADY[vendor])
    assert err.value.code.value == 704
    drv.enable_peer_access(ctx1, ctx0)                 # the other direction is separate

    drv.disable_peer_access(ctx0, ctx1)
    with pytest.raises(FornaxError) as err:
        drv.disable_peer_access(ctx0, ctx1)
    assert_code(err.value, vendor, *NOT_ENABLED[vendor])
    drv.enable_peer_access(ctx0, ctx1)                 # enabling again after a disable is fine


@pytest.mark.parametrize("vendor", EXPLICIT)
def test_enable_without_a_fabric_is_unsupported(vendor):
    drv = make_driver(vendor, kind=None, devices=2)
    with pytest.raises(FornaxError) as err:
        drv.enable_peer_access(drv.create_context(0), drv.create_context(1))
    assert_code(err.value, vendor, *UNSUPPORTED[vendor])


# -- query only (xpu-like) -------------------------------------------------------------------
def test_xpu_like_access_follows_the_query_without_an_enable_call():
    drv = make_driver("xpu-like")
    ctx0, ctx1 = drv.create_context(0), drv.create_context(1)
    x, out, _ = remote_read("xpu-like", drv, ctx0, ctx1)
    np.testing.assert_array_equal(out.astype(np.float64), x.astype(np.float64) * 3)
    with pytest.raises(NotSupportedError) as err:
        drv.enable_peer_access(ctx0, ctx1)
    assert_code(err.value, "xpu-like", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003)
    assert "zeDeviceCanAccessPeer" in str(err.value)


def test_xpu_like_without_a_fabric_faults_naming_the_owner():
    drv = make_driver("xpu-like", kind=None, devices=2)
    ctx0, ctx1 = drv.create_context(0), drv.create_context(1)
    with pytest.raises(FornaxError) as err:
        remote_read("xpu-like", drv, ctx0, ctx1)
    assert_code(err.value, "xpu-like", *ILLEGAL["xpu-like"])


# -- peer copies ---------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", API)
@pytest.mark.parametrize("kind", ["switch", "ring"])
def test_peer_copy_0_to_5_bytes_and_time(vendor, kind):
    spec = load_spec("tiny")
    drv = make_driver(vendor, kind)
    ctx0, ctx5 = drv.create_context(0), drv.create_context(5)
    nbytes = 1 << 20
    data = np.random.default_rng(3).integers(0, 256, nbytes, dtype=np.uint8)
    src, dst = drv.allocate(ctx0, nbytes), drv.allocate(ctx5, nbytes)
    q0, q5 = drv.create_queue(ctx0), drv.create_queue(ctx5)
    q0.copy_h2d(src, data)
    q0.copy_peer(ctx5, dst, src, nbytes)
    q0.synchronize()
    back = np.zeros(nbytes, np.uint8)
    q5.copy_d2h(back, dst)
    q5.synchronize()
    np.testing.assert_array_equal(back, data)

    a, b = spec.peer_link_latency_s, spec.peer_link_bandwidth
    # switch: one hop over a port of B; ring of 8: 0 -> 5 is 3 hops over links of B/2
    want = a + nbytes / b if kind == "switch" else 3 * a + nbytes / (b / 2)
    (rec,) = [r for r in drv.devices[0].timeline.records if r.label.startswith("peer")]
    assert rec.engine == ("peer" if kind == "switch" else "peer-")
    assert math.isclose(rec.end - rec.start, want, rel_tol=1e-12)
    h2d = next(r for r in drv.devices[0].timeline.records if r.label.startswith("h2d"))
    assert rec.start >= h2d.end                        # in stream order after the upload
    assert drv.report()["peer_bytes"] == nbytes


@pytest.mark.parametrize("vendor", EXPLICIT)
def test_bad_peer_copies_are_clear_errors(vendor):
    drv = make_driver(vendor)
    ctx0, ctx1 = drv.create_context(0), drv.create_context(1)
    src, dst = drv.allocate(ctx0, 8192), drv.allocate(ctx1, 256)
    q = drv.create_queue(ctx0)
    with pytest.raises(FornaxError, match="on device 1 is outside its memory"):
        q.copy_peer(ctx1, dst, src, 8192)
    with pytest.raises(FornaxError, match="between two devices"):
        q.copy_peer(ctx0, src, src, 16)
    with pytest.raises(FornaxError, match="positive integer"):
        q.copy_peer(ctx1, dst, src, 0)
    alone = make_driver(vendor, kind=None, devices=2)
    c0, c1 = alone.create_context(0), alone.create_context(1)
    with pytest.raises(FornaxError) as err:
        alone.create_queue(c0).copy_peer(c1, alone.allocate(c1, 64), alone.allocate(c0, 64), 64)
    assert_code(err.value, vendor, *UNSUPPORTED[vendor])


# -- stack config and CLI ----------------------------------------------------------------------------
def test_stack_attaches_a_topology_of_the_configured_kind():
    stack = compose(make_config("cuda-like", spec="tiny", devices=N, topology="mesh"))
    assert stack.topology.kind == "mesh" and stack.topology.devices == N
    assert all(d.topology is stack.topology for d in stack.devices)
    assert stack.driver.can_access_peer(0, 7)
    default = make_config("cuda-like", spec="tiny")
    assert default.topology == "switch"


@pytest.mark.parametrize("topology", ["torus", "", 3, None])
def test_config_rejects_unknown_topologies(topology, tmp_path):
    if topology is not None:
        with pytest.raises(ConfigError, match="unknown topology"):
            make_config("cuda-like", topology=topology)
    p = tmp_path / "stack.toml"
    value = '"torus"' if topology is None else repr(topology).replace("'", '"')
    p.write_text(f'[stack]\nvendor = "cuda-like"\ntopology = {value}\n')
    from fornax.stack import load_config
    with pytest.raises(ConfigError, match="unknown topology"):
        load_config(p)


def test_config_file_topology_is_read(tmp_path):
    from fornax.stack import load_config
    p = tmp_path / "stack.toml"
    p.write_text('[stack]\nvendor = "rocm-like"\ndevices = 4\ntopology = "ring"\n')
    cfg = load_config(p)
    assert (cfg.devices, cfg.topology) == (4, "ring")
    over = make_config(topology="mesh", base=cfg)
    assert (over.devices, over.topology) == (4, "mesh")


@pytest.mark.parametrize("args, message", [
    (["--devices", "0"], "devices must be a positive integer, got 0"),
    (["--devices", "-2"], "devices must be a positive integer, got -2"),
    (["--devices", "4", "--topology", "torus"], "unknown topology 'torus'"),
])
def test_cli_rejects_bad_devices_and_topology(args, message):
    result = CliRunner().invoke(main, ["compose", "--vendor", "rocm-like", "--spec", "tiny", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fornax: error:") and message in lines[0]


def test_cli_runs_on_device_0_of_a_ring():
    result = CliRunner().invoke(main, ["compose", "--vendor", "xpu-like", "--spec", "tiny",
                                       "--devices", str(N), "--topology", "ring", "--json"])
    assert result.exit_code == 0, result.stderr
    import json
    rep = json.loads(result.stdout)
    assert rep["manifest"]["devices"] == N
    assert rep["seams"]["driver"]["peer_bytes"] == 0
