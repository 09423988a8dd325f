"""The fornax PJRT plugin (fornax.frameworks.jax.plugin): its C function table exercised
directly, then through JAX's public API in fresh processes (a plugin registers before JAX
starts its backends): devices, transfers, plain jax.jit against the CPU, placement,
memory, errors, and the opt-in and failure paths that must leave JAX on the CPU working."""

from __future__ import annotations

import ctypes
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fornax.frameworks.jax import plugin as fp
from fornax.frameworks.jax.plugin import capi
from fornax.frameworks.jax.plugin.api import Plugin

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("pjrt_probe.py")


def _env(**extra) -> dict:
    return {**fp.without_switches(), **extra}


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_env(**env), cwd=ROOT)


# ---- the C table, called as jaxlib calls it ----------------------------------------------------
def _call(plugin: Plugin, name: str, **fields):
    """Call ``PJRT_<name>`` through its function pointer; (args struct, returned PJRT_Error*)."""
    struct = capi.ARGS[name]
    args = struct(struct_size=ctypes.sizeof(struct), **fields)
    fn = getattr(plugin.table.api, "PJRT_" + name)
    proto = capi.VOID_FN if name in capi.VOID else capi.ERROR_FN
    return args, proto(fn)(ctypes.addressof(args))


def _message(plugin: Plugin, err: int) -> tuple[int, str]:
    code, _ = _call(plugin, "Error_GetCode", error=err)
    msg, _ = _call(plugin, "Error_Message", error=err)
    text = ctypes.string_at(msg.message, msg.message_size).decode()
    _call(plugin, "Error_Destroy", error=err)
    return code.code, text


def test_the_table_declares_version_0_55_and_fills_every_slot():
    p = Plugin(fp.Settings("xpu-like"))
    api = p.table.api
    assert (api.pjrt_api_version.major_version, api.pjrt_api_version.minor_version) == (0, 55)
    assert api.struct_size == ctypes.sizeof(capi.Api) == 16 + 24 + 8 * len(capi.ARGS)
    assert all(getattr(api, "PJRT_" + n) for n in capi.ARGS)       # no null pointer jaxlib could call


def test_a_client_through_the_table_and_its_errors():
    p = Plugin(fp.Settings("rocm-like", devices=2))
    args, err = _call(p, "Client_Create")
    assert err is None and args.client
    name, _ = _call(p, "Client_PlatformName", client=args.client)
    assert ctypes.string_at(name.platform_name, name.platform_name_size) == b"fornax"
    devs, _ = _call(p, "Client_Devices", client=args.client)
    assert devs.num_devices == 2
    # a handle the plugin never made: INVALID_ARGUMENT with a message, not a crash
    _, err = _call(p, "Buffer_ElementType", buffer=0xDEAD0)
    code, text = _message(p, err)
    assert code == capi.INVALID_ARGUMENT and "PJRT_Buffer 0xdead0 is not a live handle" in text
    # a function the plugin does not implement names itself
    _, err = _call(p, "CopyToDeviceStream_TotalBytes")
    code, text = _message(p, err)
    assert code == capi.UNIMPLEMENTED and "PJRT_CopyToDeviceStream_TotalBytes is not implemented" in text
    # a destroy never fails, whatever it is given (jaxlib aborts the process on a failed destroy)
    _, err = _call(p, "Buffer_Destroy", buffer=0xBAD0)
    assert err is None
    _call(p, "Client_Destroy", client=args.client)
    assert p.clients == []


def test_lookup_of_a_missing_device_says_how_many_there_are():
    p = Plugin(fp.Settings("cuda-like"))
    args, _ = _call(p, "Client_Create")
    code, text = _message(p, _call(p, "Client_LookupDevice", client=args.client, id=3)[1])
    assert code == capi.INVALID_ARGUMENT and "no device 3" in text and "has 1 device(s)" in text


def test_settings_from_the_environment():
    assert fp.settings_from_env({}) is None
    assert fp.settings_from_env({"FORNAX_PJRT": "0"}) is None
    assert fp.settings_from_env({"FORNAX_PJRT": "1"}) == fp.Settings("cuda-like")
    assert fp.settings_from_env({"JAX_PLATFORMS": "cpu,fornax"}) == fp.Settings("cuda-like")
    assert fp.settings_from_env({"FORNAX_PJRT": "xpu-like", "FORNAX_PJRT_DEVICES": "2"}) == \
        fp.Settings("xpu-like", devices=2)
    with pytest.raises(Exception, match="FORNAX_PJRT_DEVICES='two' is not a device count"):
        fp.settings_from_env({"FORNAX_PJRT": "1", "FORNAX_PJRT_DEVICES": "two"})


def test_enable_after_jax_started_is_a_clear_error():
    import jax
    jax.devices()
    with pytest.raises(Exception, match="already initialised its backends"):
        fp.enable("cuda-like")


# ---- through JAX, in a fresh process ------------------------------------------------------------
@functools.cache
def _probe() -> dict:
    r = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=600,
                       env=_env(FORNAX_PJRT="rocm-like", FORNAX_PJRT_DEVICES="2"), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    out["stderr"] = r.stderr
    return out


def test_jax_lists_the_stacks_devices_on_the_fornax_platform():
    o = _probe()
    assert o["devices"] == ["fornax:0", "fornax:1"]
    assert o["platform"] == "fornax" and o["default_backend"] == "cpu"
    assert o["device_kind"] and "rocm-like (rocm face, hip" in o["platform_version"]
    assert o["registered_vendor"] == "rocm-like"


def test_every_device_dtype_round_trips_bit_for_bit_on_the_chosen_device():
    o = _probe()
    assert o["round_trips"] and all(t["exact"] and t["device"] == "fornax:1" for t in o["round_trips"].values())
    assert o["round_trips"]["bfloat16"]["dtype"] == "bfloat16"
    assert o["strided_exact"]


@pytest.mark.parametrize("name", ["fori_loop", "cond", "switch", "sort", "argmax", "cumsum", "gather",
                                  "scatter_add", "conv", "max_pool", "softmax_grad", "where_clip",
                                  "integer_ops", "rng_bit_generator"])
def test_plain_jax_jit_on_fornax_matches_the_cpu(name):
    c = _probe()["functions"][name]
    assert c["error"] == "" and c["shape_ok"] and c["device"] == "fornax:0"
    assert c["max_abs"] <= 2e-6


def test_calls_from_several_threads_at_once():
    assert _probe()["thread_errors"] == []


def test_a_program_runs_on_the_device_its_arguments_are_on():
    o = _probe()
    assert o["device1_result"] == "fornax:1" and o["device1_exact"]


def test_buffers_live_in_simulated_device_memory_and_are_given_back():
    o = _probe()
    assert o["live_after_put"] == 1 and o["bytes_in_use"] >= 256 * 256 * 4
    assert o["live_after_delete"] == 0 and o["is_deleted"]
    assert o["live_after_errors"] == 1     # the key the error checks keep; failing calls leak nothing
    assert o["report"]["executions"] >= 14 and o["report"]["h2d_bytes"] > 0 and o["report"]["d2h_bytes"] > 0


def test_errors_are_pjrt_errors_with_fornaxs_message():
    o = _probe()
    assert o["complex_error"].startswith("JaxRuntimeError: UNIMPLEMENTED: [framework] the fornax device holds "
                                         "no complex64 buffers")
    assert o["custom_call_error"].startswith(
        "JaxRuntimeError: UNIMPLEMENTED: [framework] stablehlo.custom_call: neither the fornax device nor "
        "XLA's CPU compiler runs it")
    assert "vendor_gemm_v9" in o["custom_call_error"]
    # the documented limit: an error JAX raises while releasing a temporary fornax array
    assert o["temporary_error"] == "SystemError: error return without exception set"
    assert "ctypes callbacks cannot keep pending" in o["stderr"] and "vendor_gemm_v9" in o["stderr"]


def test_ops_without_a_device_rule_are_named_host_fallbacks():
    fallbacks = dict(_probe()["fallbacks"])
    assert fallbacks["stablehlo.rng_bit_generator"] == ("no lax counterpart: XLA's CPU compiler runs this "
                                                        "StableHLO op on the host")
    assert "uint64 has no fornax device dtype" in fallbacks["bitcast_convert_type"]


def test_the_pjrt_calls_jax_makes():
    calls = _probe()["calls"]
    for name in ("Plugin_Initialize", "Client_Create", "Client_Devices", "Client_BufferFromHostBuffer",
                 "Client_Compile", "LoadedExecutable_Execute", "Buffer_ToHostBuffer", "Event_OnReady",
                 "Buffer_Destroy", "Device_MemoryStats"):
        assert calls.get(name, 0) >= 1, name


# ---- opting in, and failing safe ----------------------------------------------------------------------
LIST = "import jax; print([d.platform for d in jax.devices()]); print(jax.numpy.ones(2).sum())"


def test_without_opting_in_jax_has_no_fornax_platform():
    r = _python(LIST + "\ntry:\n jax.devices('fornax')\nexcept RuntimeError as e: print('no', e)")
    assert r.returncode == 0 and "['cpu']" in r.stdout and "no Unknown backend fornax" in r.stdout


@pytest.mark.parametrize("env,why", [
    ({"FORNAX_PJRT": "tpu-like"}, "unknown vendor 'tpu-like'"),
    ({"FORNAX_PJRT_CONFIG": "/nonexistent/stack.toml"}, "/nonexistent/stack.toml"),
    ({"FORNAX_PJRT": "1", "FORNAX_PJRT_DEVICES": "0"}, "devices must be a positive integer"),
])
def test_a_broken_configuration_says_why_in_one_line_and_leaves_jax_on_the_cpu(env, why):
    r = _python(LIST, **env)
    assert r.returncode == 0 and "['cpu']" in r.stdout and "2.0" in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if "fornax PJRT plugin not registered" in ln]
    assert len(lines) == 1 and why in lines[0]


def test_a_client_that_fails_to_start_is_a_quiet_backend_failure(tmp_path):
    cfg = tmp_path / "meta.toml"
    cfg.write_text('[stack]\nvendor = "cuda-like"\nmeta = true\n')
    r = _python(LIST + "\ntry:\n jax.devices('fornax')\nexcept RuntimeError as e: print('no', e)",
                FORNAX_PJRT_CONFIG=str(cfg))
    assert r.returncode == 0 and "['cpu']" in r.stdout
    assert "shape-only (meta) stack" in r.stdout


def test_jax_platforms_cpu_keeps_the_plugin_out():
    r = _python(LIST, FORNAX_PJRT="rocm-like", JAX_PLATFORMS="cpu")
    assert r.returncode == 0 and "['cpu']" in r.stdout


def test_jax_platforms_fornax_makes_it_the_default_backend():
    r = _python("import jax, jax.numpy as jnp\nprint(jax.default_backend())\n"
                "y = jax.jit(lambda x: x * 2)(jnp.arange(3.0))\nprint(y.devices(), y.tolist())",
                JAX_PLATFORMS="fornax", FORNAX_PJRT="xpu-like")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["fornax", "{FornaxDevice(id=0, family=xpu-like)} [0.0, 2.0, 4.0]"]
