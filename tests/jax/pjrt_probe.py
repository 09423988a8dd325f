"""Run in a fresh process with FORNAX_PJRT set: exercises the fornax PJRT plugin through
JAX's public API and prints one JSON document of what it saw (tests/jax/test_pjrt_plugin.py
asserts on it).  Every numeric check compares with jax.jit on the CPU in the same process."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from fornax.frameworks.jax import plugin as fp

out: dict = {}
cpu = jax.devices("cpu")[0]
devs = jax.devices("fornax")
out["devices"] = [str(d) for d in devs]
out["platform"] = devs[0].platform
out["device_kind"] = devs[0].device_kind
out["platform_version"] = devs[0].client.platform_version
out["default_backend"] = jax.default_backend()
out["registered_vendor"] = fp.plugin().settings.vendor
client = fp.plugin().clients[0]

# -- transfers: every device dtype round-trips bit for bit, on a chosen device ---------------------
rng = np.random.default_rng(0)
trips = {}
for name in ("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "uint32", "bool"):
    dt = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    host = (rng.standard_normal((3, 5)) * 50).astype(dt)
    x = jax.device_put(host, devs[-1])
    back = np.asarray(x)
    trips[name] = {"exact": bool(back.tobytes() == host.tobytes()), "device": str(next(iter(x.devices()))),
                   "dtype": str(x.dtype)}
out["round_trips"] = trips
strided = np.arange(48, dtype=np.float32).reshape(6, 8)[::2, 1::3]
out["strided_exact"] = bool(np.array_equal(np.asarray(jax.device_put(strided, devs[0])), strided))

# -- held-out functions through plain jax.jit on fornax, against the CPU ---------------------------
x = rng.standard_normal((4, 6)).astype(np.float32)
idx = np.array([3, 0, 2, 2], np.int32)
img = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
ker = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
FUNCS = {
    "fori_loop": (lambda a: lax.fori_loop(0, 5, lambda i, c: c * 0.5 + jnp.sin(c) * i, a), (x,)),
    "cond": (lambda a: lax.cond(a.sum() > 0, lambda v: v * 2, lambda v: -v, a), (x,)),
    "switch": (lambda a: lax.switch(2, [jnp.sin, jnp.cos, jnp.tanh], a), (x,)),
    "sort": (lambda a: jnp.sort(a, axis=1), (x,)),
    "argmax": (lambda a: jnp.argmax(a, axis=1), (x,)),
    "cumsum": (lambda a: jnp.cumsum(a, axis=1), (x,)),
    "gather": (lambda a, i: a[i], (x, idx)),
    "scatter_add": (lambda a, i: a.at[i].add(1.0), (x, idx)),
    "conv": (lambda a, k: lax.conv_general_dilated(a, k, (1, 1), "SAME"), (img, ker)),
    "max_pool": (lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "VALID"), (img,)),
    "softmax_grad": (jax.grad(lambda a: jax.nn.log_softmax(a).sum() + (a ** 2).mean()), (x,)),
    "where_clip": (lambda a: jnp.where(a > 0, jnp.clip(a, 0.1, 0.9), jnp.exp(a)), (x,)),
    "integer_ops": (lambda i: (i * 7 + 3) % 5 - (i >> 1), (idx,)),
    # no lax counterpart: the op runs on the host, compiled alone by XLA's CPU compiler
    "rng_bit_generator": (lambda k: lax.rng_bit_generator(k, (3, 5))[1], (np.arange(4, dtype=np.uint32),)),
}
checks = {}
for name, (fn, args) in FUNCS.items():
    ref = np.asarray(jax.jit(fn)(*jax.device_put(args, cpu)))
    try:
        res = jax.jit(fn)(*jax.device_put(args, devs[0]))
        got = np.asarray(res)
        checks[name] = {"max_abs": float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
                        if ref.size else 0.0, "shape_ok": got.shape == ref.shape and got.dtype == ref.dtype,
                        "device": str(next(iter(res.devices()))), "error": ""}
    except Exception as exc:
        checks[name] = {"error": f"{type(exc).__name__}: {exc}"}
out["functions"] = checks

# -- placement: a program on device 1 runs there --------------------------------------------------
y = jax.jit(lambda a: a + 1)(jax.device_put(x, devs[1]))
out["device1_result"] = str(next(iter(y.devices())))
out["device1_exact"] = bool(np.array_equal(np.asarray(y), x + 1))
y.block_until_ready()

# -- threads: JAX calls the plugin from several threads at once -----------------------------------
import threading  # noqa: E402

square = jax.jit(lambda a: jnp.tanh(a @ a.T).sum())
thread_errors: list = []


def worker(i):
    try:
        for k in range(3):
            v = np.full((8, 8), 0.1 * (i + k), np.float32)
            got = float(square(jax.device_put(v, devs[i % 2])))
            assert abs(got - float(np.tanh(v @ v.T).sum())) < 1e-4
    except Exception as exc:                # noqa: BLE001  (reported, not raised, from a thread)
        thread_errors.append(f"{type(exc).__name__}: {exc}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["thread_errors"] = thread_errors

# -- memory: buffers live in simulated device memory and are given back ---------------------------
fc = client.fornax
base = fc.live_buffers()
big = jax.device_put(np.ones((256, 256), np.float32), devs[0])
out["live_after_put"] = fc.live_buffers() - base
out["bytes_in_use"] = devs[0].memory_stats()["bytes_in_use"]
big.delete()
out["live_after_delete"] = fc.live_buffers() - base
out["is_deleted"] = big.is_deleted()

# -- errors: PJRT errors carrying fornax's message -------------------------------------------------
def error_of(thunk) -> str:
    try:
        thunk()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""

out["complex_error"] = error_of(lambda: jax.device_put(np.ones(3, np.complex64), devs[0]).block_until_ready())
def foreign(v):                      # a custom call into a library nothing here implements
    return jax.ffi.ffi_call("vendor_gemm_v9", jax.ShapeDtypeStruct(v.shape, v.dtype))(v)


key = jax.device_put(np.zeros(4, np.float32), devs[0])
out["custom_call_error"] = error_of(lambda: jax.jit(foreign)(key))
# an array JAX releases while it raises (a temporary argument of the failing call): Python's
# ctypes callbacks cannot keep the error pending, so it surfaces as SystemError (logged)
out["temporary_error"] = error_of(lambda: jax.jit(foreign)(jax.device_put(np.zeros(4, np.float32), devs[0])))
out["fallbacks"] = sorted({r["primitive"]: r["reason"] for r in fc.report()["primitives"]
                           if r["route"] == "fallback"}.items())
out["live_after_errors"] = fc.live_buffers() - base
out["calls"] = dict(fp.plugin().table.calls)
out["report"] = {k: v for k, v in fc.report().items() if k in ("totals", "executions", "h2d_bytes", "d2h_bytes")}
json.dump(out, sys.stdout)
