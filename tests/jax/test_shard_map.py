"""``jax.shard_map`` / ``jax.pmap`` programs over a mesh of a stack's simulated devices, run by
``fornax.frameworks.jax.jit``: every device runs its shard, the collectives run on the
library's communicators between the devices, and the results are those of ``jax.jit`` of the
same program on as many CPU devices (computed in a subprocess that forces four host devices),
of numpy, and of single-device training on the whole batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AbstractMesh, Mesh
from jax.sharding import PartitionSpec as P

import fornax.frameworks.jax as fj
from fornax.layers.errors import InvalidArgumentError
from fornax.stack import BUILTIN_FAMILIES

N = 4
NAMES = ("reductions", "all_gather", "ppermute", "all_to_all", "psum_scatter", "mesh_2x2", "dp_mlp_step", "pmap")
_clients: dict[str, fj.Client] = {}


def client_of(family: str) -> fj.Client:
    """One four-device client per family for the module (compiled programs are reused)."""
    if family not in _clients:
        _clients[family] = fj.Client.for_vendor(family, spec="tiny", devices=N)
    return _clients[family]


def rand(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


# ---- the programs (built over any four devices: fornax's here, the CPU's in the subprocess) -------
def _mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def _mlp_step(params, x, y, lr=0.1):
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


MLP_ARGS = ({"w1": rand(6, 8, seed=1), "b1": rand(8, seed=2), "w2": rand(8, 3, seed=3)},
            rand(16, 6, seed=4), rand(16, 3, seed=5))


def programs(devices) -> dict:
    """name -> (function, arguments) for four devices."""
    line = Mesh(np.array(devices[:N], dtype=object), ("x",))
    square = Mesh(np.array(devices[:N], dtype=object).reshape(2, 2), ("x", "y"))

    def reductions(a):
        return (lax.psum(a, "x"), lax.pmax(a, "x"), lax.pmin(a, "x"),
                lax.axis_index("x")[None] * 10, lax.psum(lax.axis_index("x"), "x")[None])

    def gathers(a):
        return (lax.all_gather(a, "x", tiled=True), lax.all_gather(a, "x", axis=1),
                lax.all_gather(a, "x", axis=1, tiled=True))

    def permutes(a):
        ring = lax.ppermute(a, "x", [(i, (i + 1) % N) for i in range(N)])
        partial = lax.ppermute(a, "x", [(0, 2), (3, 3)])
        return ring, partial

    def all_to_alls(a):
        return (lax.all_to_all(a, "x", 0, 1, tiled=True), lax.all_to_all(a, "x", 1, 0, tiled=True),
                lax.all_to_all(a.reshape(N, -1), "x", 0, 0, tiled=True))

    def scatters(a):
        return lax.psum_scatter(a, "x", tiled=True), lax.psum_scatter(a, "x", scatter_dimension=1, tiled=True)

    def grid(a, b):
        s = lax.psum(a * b, "y")                       # over one axis of the 2x2 mesh
        g = lax.all_gather(a, "x", tiled=True)         # over the other
        m = lax.pmax(jnp.max(a), ("x", "y"))
        i = lax.axis_index(("x", "y"))
        return s, g, m, i.reshape(1, 1)

    def dp_step(params, x, y):
        loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
        grads = jax.tree_util.tree_map(lambda g: lax.psum(g, "x") / N, grads)
        new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
        return new, lax.pmean(loss, "x")

    def pmapped(v):
        return lax.psum(v, "i") * lax.ppermute(v, "i", [(i, (i + 1) % N) for i in range(N)])

    sm = jax.shard_map
    vec, mat, sq = rand(8 * N), rand(4 * N, 8, seed=1), rand(8, 8, seed=2)
    return {
        "reductions": (sm(reductions, mesh=line, in_specs=P("x"), out_specs=(P(), P(), P(), P("x"), P("x")),
                          check_vma=False), (vec,)),
        "all_gather": (sm(gathers, mesh=line, in_specs=P("x"), out_specs=(P(), P("x"), P("x")),
                          check_vma=False), (mat,)),
        "ppermute": (sm(permutes, mesh=line, in_specs=P("x"), out_specs=P("x")), (mat,)),
        "all_to_all": (sm(all_to_alls, mesh=line, in_specs=P("x"), out_specs=P("x")), (mat,)),
        "psum_scatter": (sm(scatters, mesh=line, in_specs=P(None, "x"), out_specs=P("x"),
                            check_vma=False), (rand(8, 8 * N, seed=3),)),
        "mesh_2x2": (sm(grid, mesh=square, in_specs=(P("x", "y"), P()),
                        out_specs=(P("x"), P("x", "y"), P(), P("x", "y"))), (sq, np.float32(0.5))),
        "dp_mlp_step": (sm(dp_step, mesh=line, in_specs=(P(), P("x"), P("x")), out_specs=(P(), P()),
                           check_vma=False), MLP_ARGS),
        "pmap": (jax.pmap(pmapped, axis_name="i", devices=list(devices[:N])), (rand(N, 3, seed=6),)),
    }


def _flat(tree) -> list[np.ndarray]:
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(tree)]


def write_reference(path: str) -> None:
    """jax.jit of every program on four CPU devices (run in a subprocess that forces them)."""
    assert len(jax.devices()) == N, jax.devices()
    out = {name: [v.tolist() for v in _flat(jax.jit(fn)(*args))]
           for name, (fn, args) in programs(jax.devices()).items()}
    Path(path).write_text(json.dumps(out))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("shard_map") / "reference.json"
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={N}", "JAX_PLATFORMS": "cpu"}
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]; "
            f"import test_shard_map as t; t.write_reference({str(path)!r})")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(path.read_text())


def run(family: str, name: str):
    c = client_of(family)
    fn, args = programs(c.devices())[name]
    return fj.jit(fn, stack=c)(*args)


# ---- tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_the_client_lists_every_device_with_its_properties(family):
    c = client_of(family)
    devs = c.devices()
    assert [d.id for d in devs] == list(range(N)) and fj.devices(c) == devs
    assert {d.platform for d in devs} == {c.platform}
    for d in devs:
        props = d.properties()
        assert props["id"] == d.id and props["compute_units"] == 4 and props["memory_bytes"] == 64 << 20
        assert props["name"] == d.device_kind and props["target"] and props["native"]
    assert repr(devs[3]) == f"{c.device_class}(id=3)" and str(devs[3]) == f"{c.platform}:3"
    buf = fj.device_put(np.arange(4, dtype=np.float32), device=devs[2])
    assert buf.device() is devs[2] and np.asarray(buf).tolist() == [0, 1, 2, 3]
    assert c.placement(2).stream.device == 2 and c.placement(2)._live
    # executables run on device 0: a buffer of another device is copied there for the call
    assert np.asarray(fj.jit(lambda v: v * 2, stack=c)(buf)).tolist() == [0, 2, 4, 6]
    exe = c.compile(lambda v: v + 1, buf.aval)
    with pytest.raises(InvalidArgumentError, match=r"argument 0 is on .*\(id=2\); executables run on device 0"):
        exe.execute([buf])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_each_program_matches_jax_jit_on_four_cpu_devices(family, name, reference):
    got = _flat(run(family, name))
    want = reference[name]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w, dtype=g.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_a_data_parallel_step_equals_single_device_training_on_the_whole_batch(family):
    (new, loss), (want, want_loss) = run(family, "dp_mlp_step"), jax.jit(_mlp_step)(*MLP_ARGS)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    for k in want:
        np.testing.assert_allclose(np.asarray(new[k]), np.asarray(want[k]), rtol=1e-5, atol=1e-6)
    c = client_of(family)
    psums = [r for r in c.report()["collectives"] if r["primitive"] == "psum"]
    assert {r["call"] for r in psums} == {c.stack.library.facts["library"]["collectives"]["calls"]["all_reduce"]}
    assert all(r["devices"] == [0, 1, 2, 3] and r["time_s"] > 0 for r in psums)


@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_collectives_move_the_blocks_numpy_says(family):
    mat = rand(4 * N, 8, seed=1)
    blocks = mat.reshape(N, 4, 8)
    ring, partial = run(family, "ppermute")
    np.testing.assert_array_equal(np.asarray(ring), np.roll(blocks, 1, axis=0).reshape(mat.shape))
    want = np.zeros_like(blocks)
    want[2], want[3] = blocks[0], blocks[3]           # nobody sends to 0 and 1: zeros, as in jax
    np.testing.assert_array_equal(np.asarray(partial), want.reshape(mat.shape))
    a2a, back, _ = run(family, "all_to_all")
    # device d gets row-block d of every device's block, side by side
    expect = np.concatenate([np.concatenate([blocks[s][d:d + 1] for s in range(N)], axis=1)
                             for d in range(N)], axis=0)
    np.testing.assert_array_equal(np.asarray(a2a), expect)
    assert np.asarray(back).shape == (4 * N * N, 2)
    tiled, stacked, side = run(family, "all_gather")
    np.testing.assert_array_equal(np.asarray(tiled), mat)
    np.testing.assert_array_equal(np.asarray(stacked), np.tile(blocks.transpose(1, 0, 2), (N, 1, 1)))
    assert np.asarray(side).shape == (4 * N, 8 * N)


@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_a_2x2_mesh_reduces_over_one_axis(family):
    sq = rand(8, 8, seed=2)
    s, g, m, i = run(family, "mesh_2x2")
    q = sq.reshape(2, 4, 2, 4).transpose(0, 2, 1, 3) * 0.5          # [x, y] blocks
    np.testing.assert_allclose(np.asarray(s), np.concatenate([q[x].sum(0) for x in range(2)]), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(g), np.vstack([sq, sq]))    # every row has all of x
    assert float(m) == sq.max() and np.asarray(i).tolist() == [[0, 1], [2, 3]]
    c = client_of(family)
    groups = {tuple(r["devices"]) for r in c.report()["collectives"] if r["primitive"] == "psum_invariant"}
    assert groups == {(0, 1), (2, 3)}               # 'y' joins the devices of one row


@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_the_collectives_are_on_every_device_timeline_without_races(family):
    c = client_of(family)
    run(family, "reductions")
    for dev in c.stack.devices[:N]:
        labels = [r.label for r in dev.timeline.records]
        assert any(lbl.startswith("peer ") for lbl in labels), labels[-10:]
        assert not dev.timeline.races, dev.timeline.races[:3]
    text = fj.jit(programs(c.devices())["reductions"][0], stack=c).lower(rand(8 * N))[0].describe()
    assert "shard_map over mesh ('x': 4) on devices [0, 1, 2, 3]" in text
    assert "collective psum over 'x' -> the library's all-reduce" in text
    routes = {(r["primitive"], r["route"]) for r in c.report()["primitives"]}
    assert {("shard_map", "spmd"), ("psum", "collective"), ("axis_index", "native")} <= routes


LOOPS = {
    # a collective in a loop body or a loop condition: every device meets it on every iteration
    "scan": (lambda a: lax.scan(lambda c, t: (lax.psum(c * t, "x"), c), a[0], a)[1],
             np.arange(1, 9, dtype=np.float32) / 10),
    "while": (lambda a: lax.while_loop(lambda v: lax.psum(v, "x").sum() < 100, lambda v: v * 2, a),
              np.arange(1, 9, dtype=np.float32)),
    # data movement of types the library does not name: moved as bytes
    "bool ring": (lambda a: lax.ppermute(a, "x", [(i, (i + 1) % N) for i in range(N)]), np.arange(16) % 3 == 0),
    "int8 gather": (lambda a: lax.all_gather(a, "x", tiled=True)[None], np.arange(16, dtype=np.int8)),
    "uint8 pmax": (lambda a: lax.pmax(a, "x"), np.arange(16, dtype=np.uint8)),
}


@pytest.mark.parametrize("case", sorted(LOOPS))
@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_loops_holding_collectives_and_narrow_types_match_jax(family, case):
    body, x = LOOPS[case]
    c = client_of(family)
    f = jax.shard_map(body, mesh=fj.mesh(N, "x", stack=c), in_specs=P("x"), out_specs=P("x"), check_vma=False)
    got = np.asarray(fj.jit(f, stack=c)(x))
    # jax's own semantics of the same collectives on one CPU device: vmap with the axis name
    want = np.asarray(jax.jit(jax.vmap(body, axis_name="x"))(x.reshape(N, -1))).reshape(got.shape)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6)
    assert not any(dev.timeline.races for dev in c.stack.devices)


@pytest.mark.parametrize("family", BUILTIN_FAMILIES)
def test_pbroadcast_copies_the_source_block_everywhere(family):
    # XLA's CPU backend has no rule for pbroadcast: numpy is the reference
    c = client_of(family)
    f = jax.shard_map(lambda a: lax.pbroadcast(a, "x", 2), mesh=fj.mesh(N, "x", stack=c), in_specs=P("x"),
                      out_specs=P("x"), check_vma=False)
    x = rand(3 * N)
    np.testing.assert_array_equal(np.asarray(fj.jit(f, stack=c)(x)), np.tile(x[6:9], N))
    assert c.report()["collectives"][-1]["op"] == "broadcast"


def test_a_mesh_of_jax_cpu_devices_keeps_jax_on_the_host():
    c = client_of("cuda-like")
    f = jax.shard_map(lambda a: lax.psum(a, "x"), mesh=Mesh(np.array(jax.devices()[:1]), ("x",)),
                      in_specs=P("x"), out_specs=P())
    x = rand(4)
    np.testing.assert_allclose(np.asarray(fj.jit(f, stack=c)(x)), x)
    reasons = [r["reason"] for r in c.report()["fallbacks"] if r["primitive"] == "shard_map"]
    assert reasons and "mesh of cpu devices runs on the host" in reasons[0] and "fj.mesh" in reasons[0]


# ---- bad input --------------------------------------------------------------------------------------
def test_a_mesh_larger_than_the_stack_is_refused():
    c = client_of("rocm-like")
    with pytest.raises(fj.JaxDeviceError, match=r"needs 8 devices; the stack .* has 4") as e:
        fj.mesh((2, 4), ("x", "y"), stack=c)
    assert "devices=8" in e.value.hint
    f = jax.shard_map(lambda a: a * 2, mesh=AbstractMesh((8,), ("x",)), in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(fj.JaxDeviceError, match=r"abstract mesh \('x': 8\) needs 8 devices") as e:
        fj.jit(f, stack=c)(rand(16))
    assert "--devices 8" in e.value.hint


def test_an_abstract_mesh_maps_onto_the_first_devices():
    c = client_of("rocm-like")
    f = jax.shard_map(lambda a: lax.psum(a, "x"), mesh=AbstractMesh((2,), ("x",)), in_specs=P("x"),
                      out_specs=P(), check_vma=False)
    x = rand(8)
    np.testing.assert_allclose(np.asarray(fj.jit(f, stack=c)(x)), x[:4] + x[4:], rtol=1e-6)
    assert c.report()["collectives"][-1]["devices"] == [0, 1]


def test_devices_of_another_client_are_refused():
    other = fj.Client.for_vendor("cuda-like", spec="tiny", devices=2)
    f = jax.shard_map(lambda a: a, mesh=fj.mesh(2, "x", stack=other), in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(fj.JaxDeviceError, match="not a device of this client"):
        fj.jit(f, stack=client_of("xpu-like"))(rand(4))


def test_an_unsupported_collective_is_refused_by_name():
    c = client_of("xpu-like")

    def body(x, out, offs, sizes, outoffs, recv):
        return lax.ragged_all_to_all(x, out, offs, sizes, outoffs, recv, axis_name="x")
    i = np.zeros(N * N, np.int32)
    f = jax.shard_map(body, mesh=fj.mesh(N, "x", stack=c), in_specs=P("x"), out_specs=P("x"), check_vma=False)
    with pytest.raises(fj.JaxDeviceError, match="ragged_all_to_all in a shard_map body: fornax does not "
                                                "lower this jax collective") as e:
        fj.jit(f, stack=c)(rand(4 * N), rand(4 * N), i, i, i, i)
    assert "jax.jit" in e.value.hint


def test_partly_manual_axes_and_unsupported_types_are_refused():
    c = client_of("cuda-like")
    m = fj.mesh((2, 2), ("x", "y"), stack=c)
    f = jax.shard_map(lambda a: a * 2, mesh=m, in_specs=P("x"), out_specs=P("x"), axis_names={"x"})
    with pytest.raises(fj.JaxDeviceError, match="leaves axes 'y' to the compiler"):
        fj.jit(f, stack=c)(rand(4, 4))
    g = jax.shard_map(lambda a: lax.psum(a, "x"), mesh=fj.mesh(N, "x", stack=c), in_specs=P("x"),
                      out_specs=P(), check_vma=False)
    with pytest.raises(fj.JaxDeviceError, match=r"psum in a shard_map body: the library's collectives "
                                                r"reduce float32.*not uint8\[2\]") as e:
        fj.jit(g, stack=c)(np.arange(8, dtype=np.uint8))
    assert "cast" in e.value.hint


def test_devices_that_diverge_at_a_collective_are_named():
    c = client_of("cuda-like")

    def body(a):
        return lax.cond(lax.axis_index("x") == 0, lambda v: lax.psum(v, "x"), lambda v: v * 2, a)
    f = jax.shard_map(body, mesh=fj.mesh(N, "x", stack=c), in_specs=P("x"), out_specs=P("x"),
                      check_vma=False)
    with pytest.raises(fj.JaxDeviceError, match=r"diverged: device\(s\) \[0\] reached psum over 'x'; "
                                                r"device\(s\) \[1, 2, 3\] returned"):
        fj.jit(f, stack=c)(rand(8))
