"""Composing stacks: configs, format negotiation, mixing families, plugins, bad input."""

from __future__ import annotations

import itertools
import sys
import textwrap
import types
from importlib import metadata

import ml_dtypes
import numpy as np
import pytest

import fornax.stack as stack_mod
from fornax.layers.errors import (
    ConfigError,
    FormatMismatchError,
    InvalidArgumentError,
    UnknownSeamError,
    UnknownVendorError,
)
from fornax.layers.graph import DType, Graph
from fornax.layers.vendor import SEAMS, Vendor
from fornax.stack import (
    compose,
    get_vendor,
    load_config,
    make_config,
    parse_seam_overrides,
)
from helpers import FAMILIES

VENDORS = FAMILIES
BF16 = np.dtype(ml_dtypes.bfloat16)
F64 = np.float64


# -- workloads with independent float64 references ------------------------------------------
def mlp(dtype: DType = DType.FLOAT32, m=16, k=32, h=48, n=10, seed=0):
    """matmul + bias + relu + matmul."""
    rng = np.random.default_rng(seed)
    npdt = dtype.numpy
    w1 = (rng.standard_normal((k, h)) / np.sqrt(k)).astype(npdt)
    b1 = (rng.standard_normal((h,)) / 4).astype(npdt)
    w2 = (rng.standard_normal((h, n)) / np.sqrt(h)).astype(npdt)
    x = rng.standard_normal((m, k)).astype(npdt)
    g = Graph("mlp")
    xi = g.input("x", (m, k), dtype)
    hid = g.op("relu", g.op("add", g.op("matmul", xi, g.constant(w1, "w1")), g.constant(b1, "b1")))
    g.output(g.op("matmul", hid, g.constant(w2, "w2")))
    ref = np.maximum(x.astype(F64) @ w1.astype(F64) + b1.astype(F64), 0) @ w2.astype(F64)
    return g, {"x": x}, ref


def row_softmax(rows=12, cols=40, seed=1):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    g = Graph("softmax")
    g.output(g.op("softmax", g.input("x", (rows, cols), DType.FLOAT32), axis=-1))
    z = x.astype(F64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return g, {"x": x}, e / e.sum(axis=1, keepdims=True)


def rel_err(out, ref) -> float:
    return float(np.abs(np.asarray(out, F64) - ref).max() / np.abs(ref).max())


def check_numbers(stack, rtol=1e-4):
    for build in (mlp, row_softmax):
        g, feeds, ref = build()
        res = stack.run(g, feeds)
        assert len(res.outputs) == 1
        assert res.outputs[0].shape == ref.shape and res.outputs[0].dtype == np.float32
        assert rel_err(res.outputs[0], ref) <= rtol, f"{g.name} on {stack.config.seams}"


# -- whole families and mixed stacks ------------------------------------------------------------
@pytest.mark.parametrize("vendor", VENDORS)
def test_each_family_runs_mlp_and_softmax(vendor):
    stack = compose(make_config(vendor, spec="tiny"))
    assert {v.name for v in stack.vendors.values()} == {vendor}
    check_numbers(stack)


# compiler, library and driver must share a binary family; runtime and framework mix freely
MIXED = [dict(zip(("runtime", "framework"), rf), base=base)
         for base in VENDORS for rf in itertools.product(VENDORS, repeat=2) if rf != (base, base)]


@pytest.mark.parametrize("mix", MIXED, ids=lambda m: f"{m['base']}+rt={m['runtime']}+fw={m['framework']}")
def test_mixed_stacks_compose_and_match_float64(mix):
    mix = dict(mix)
    base = mix.pop("base")
    stack = compose(make_config(base, seams=mix, spec="tiny"))
    assert stack.vendors["runtime"].name == mix["runtime"]
    assert stack.vendors["framework"].name == mix["framework"]
    assert stack.vendors["driver"].name == base
    check_numbers(stack)


def test_mixed_stack_keeps_each_seams_own_face():
    stack = compose(make_config("cuda-like", seams={"framework": "xpu-like", "runtime": "rocm-like"},
                                spec="tiny"))
    assert stack.framework.face.device_type == "xpu"
    assert stack.framework.face.dist_backend == "xccl"
    assert stack.negotiation["compiler_format"] in ("ptx-like", "cubin-like")
    assert stack.target.arch == "sm_80"


@pytest.mark.parametrize("vendor", VENDORS)
def test_bfloat16_mlp_within_bf16_tolerance(vendor):
    stack = compose(make_config(vendor, spec="tiny"))
    g, feeds, ref = mlp(DType.BFLOAT16, m=8, k=32, h=32, n=8, seed=4)
    (out,) = stack.run(g, feeds).outputs
    assert out.dtype == BF16
    # bf16 keeps 8 significant bits: one rounding of the hidden layer and one of the output
    assert rel_err(out, ref) <= 3e-2


def test_h200_like_spec_composes():
    stack = compose(make_config("rocm-like", spec="h200-like"))
    assert stack.target.arch == "gfx942"
    g, feeds, ref = mlp()
    assert rel_err(stack.run(g, feeds).outputs[0], ref) <= 1e-4


# -- negotiation failures -----------------------------------------------------------------------
def test_cuda_compiler_on_rocm_driver_is_a_format_mismatch_without_portability_paths():
    # with paths on, a ZLUDA-like translator carries it (tests/test_portability.py)
    cfg = make_config("rocm-like", seams={"compiler": "cuda-like"}, spec="tiny", translate=False)
    with pytest.raises(FormatMismatchError) as exc:
        compose(cfg)
    msg = str(exc.value)
    assert "ptx-like" in msg and "hsaco-like" in msg
    assert "cuda-like" in msg and "rocm-like" in msg


def test_xpu_library_on_cuda_driver_is_a_format_mismatch_without_portability_paths():
    # with paths on, oneMath's cuBLAS backend carries it (tests/test_portability.py)
    cfg = make_config("cuda-like", seams={"library": "xpu-like"}, spec="tiny", translate=False)
    with pytest.raises(FormatMismatchError) as exc:
        compose(cfg)
    msg = str(exc.value)
    assert "spirv-like" in msg and ("ptx-like" in msg or "cubin-like" in msg) and "switched off" in msg


@pytest.mark.parametrize("driver,other", [(d, o) for d in VENDORS for o in VENDORS if d != o])
def test_every_cross_family_compiler_or_library_is_rejected(driver, other):
    # without translation no two families' formats meet (translation: tests/test_translate.py)
    for seam in ("compiler", "library"):
        with pytest.raises(FormatMismatchError):
            compose(make_config(driver, seams={seam: other}, spec="tiny", translate=False))


# -- unknown names ------------------------------------------------------------------------------
def test_unknown_vendor_lists_valid_vendors():
    with pytest.raises(UnknownVendorError) as exc:
        make_config("nvidia")
    for v in VENDORS:
        assert v in str(exc.value)
    with pytest.raises(UnknownVendorError):
        make_config("cuda-like", seams={"runtime": "bogus-like"})
    with pytest.raises(UnknownVendorError) as exc:
        get_vendor("bogus-like")
    assert "rocm-like" in str(exc.value)


def test_unknown_seam_in_overrides():
    assert parse_seam_overrides(["compiler=rocm-like", " runtime = xpu-like "]) == {
        "compiler": "rocm-like", "runtime": "xpu-like"}
    with pytest.raises(UnknownSeamError) as exc:
        parse_seam_overrides(["kernel=cuda-like"])
    for s in SEAMS:
        assert s in str(exc.value)
    with pytest.raises(UnknownSeamError):
        make_config("cuda-like", seams={"assembler": "cuda-like"})
    for bad in ("compiler", "compiler=", "=cuda-like"):
        with pytest.raises(ConfigError):
            parse_seam_overrides([bad])


def test_missing_seams_without_vendor():
    with pytest.raises(ConfigError) as exc:
        make_config(seams={"compiler": "cuda-like"})
    assert "driver" in str(exc.value)


@pytest.mark.parametrize("kw", [{"devices": 0}, {"devices": True}, {"devices": "2"},
                                {"seed": -1}, {"seed": 1.5}])
def test_make_config_rejects_bad_values(kw):
    with pytest.raises(ConfigError):
        make_config("cuda-like", **kw)


def test_unknown_spec_at_compose():
    with pytest.raises(ConfigError) as exc:
        compose(make_config("cuda-like", spec="no-such-chip"))
    assert "tiny" in str(exc.value)


# -- config files -------------------------------------------------------------------------------
def write(tmp_path, text: str, name="stack.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_load_config_reads_data(tmp_path):
    p = write(tmp_path, """
        [stack]
        vendor = "rocm-like"
        spec = "tiny"
        devices = 2
        seed = 7

        [stack.seams]
        runtime = "cuda-like"
        framework = "xpu-like"
    """)
    cfg = load_config(p)
    assert cfg.spec == "tiny" and cfg.devices == 2 and cfg.seed == 7
    assert cfg.seams == {"framework": "xpu-like", "compiler": "rocm-like", "library": "rocm-like",
                         "runtime": "cuda-like", "driver": "rocm-like"}
    stack = compose(cfg)
    assert len(stack.devices) == 2 and stack.driver.device_count() == 2
    g, feeds, ref = mlp()
    assert rel_err(stack.run(g, feeds).outputs[0], ref) <= 1e-4
    # flags override the file
    over = make_config(seams={"runtime": "rocm-like"}, spec="h200-like", base=cfg)
    assert over.seams["runtime"] == "rocm-like" and over.seams["framework"] == "xpu-like"
    assert (over.spec, over.devices, over.seed) == ("h200-like", 2, 7)


def test_config_with_only_seams(tmp_path):
    p = write(tmp_path, """
        [stack.seams]
        framework = "cuda-like"
        compiler = "xpu-like"
        library = "xpu-like"
        runtime = "rocm-like"
        driver = "xpu-like"
    """)
    cfg = load_config(p)
    assert cfg.seams["driver"] == "xpu-like" and cfg.spec == "h200-like" and cfg.devices == 1


def test_unknown_seam_in_toml(tmp_path):
    p = write(tmp_path, """
        [stack]
        vendor = "cuda-like"
        [stack.seams]
        linker = "cuda-like"
    """)
    with pytest.raises(UnknownSeamError) as exc:
        load_config(p)
    assert "linker" in str(exc.value)


def test_unknown_vendor_in_toml(tmp_path):
    p = write(tmp_path, """
        [stack]
        vendor = "cuda-like"
        [stack.seams]
        driver = "metal-like"
    """)
    with pytest.raises(UnknownVendorError) as exc:
        load_config(p)
    assert "metal-like" in str(exc.value) and "xpu-like" in str(exc.value)


@pytest.mark.parametrize("text,needle", [
    ("[stack\nvendor = 'cuda-like'\n", "not valid TOML"),
    ("[stack]\nvendor = cuda-like\n", "not valid TOML"),
    ("[stack]\nvendor = \"cuda-like\"\nflavour = \"spicy\"\n", "flavour"),
    ("[stack]\nvendor = \"cuda-like\"\n[extra]\nx = 1\n", "extra"),
    ("[other]\nvendor = \"cuda-like\"\n", "other"),
    ("vendor = \"cuda-like\"\n", "vendor"),
    ("stack = 3\n", "[stack]"),
    ("[stack]\nvendor = 3\n", "vendor"),
    ("[stack]\nvendor = \"cuda-like\"\nspec = 9\n", "spec"),
    ("[stack]\nvendor = \"cuda-like\"\ndevices = \"two\"\n", "devices"),
    ("[stack]\nvendor = \"cuda-like\"\ndevices = 1.0\n", "devices"),
    ("[stack]\nvendor = \"cuda-like\"\nseed = -3\n", "seed"),
    ("[stack]\nvendor = \"cuda-like\"\nseams = \"rocm-like\"\n", "seams"),
    ("[stack]\nvendor = [\"cuda-like\"]\n", "vendor"),
    ("[stack]\nvendor = \"cuda-like\"\n[stack.seams]\ndriver = 5\n", "driver"),
])
def test_bad_config_files_are_config_errors(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert needle in str(exc.value)


def test_missing_and_unreadable_config_files(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path / "nope.toml")
    assert "does not exist" in str(exc.value)
    with pytest.raises(ConfigError):
        load_config(tmp_path)                              # a directory, not a file
    p = tmp_path / "binary.toml"
    p.write_bytes(b"\xff\xfe[stack]\x00\x81")
    with pytest.raises(ConfigError):
        load_config(p)


def test_config_files_are_data_not_code(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f'[stack]\nvendor = "__import__(\'pathlib\').Path(\'{marker}\').touch()"\n',
        f'[stack]\nvendor = "cuda-like"\nexec = "open(\'{marker}\', \'w\')"\n',
        ('[stack]\nvendor = "cuda-like"\nspec = "tiny"\n[stack.seams]\n'
        'driver = "os:system"\n'),
        '[stack]\nvendor = "fornax.vendors.cuda_like:VENDOR"\n',
    ]
    for text in payloads:
        p = write(tmp_path, text)
        with pytest.raises(ConfigError):
            load_config(p)
    assert not marker.exists()


# -- third-party vendors through the entry-point group -------------------------------------------
def _fake_entry_points(monkeypatch, eps: list[metadata.EntryPoint]):
    def entry_points(**kw):
        assert kw.get("group") == "fornax.vendors"
        return [ep for ep in eps if ep.group == kw["group"]]

    monkeypatch.setattr(stack_mod.metadata, "entry_points", entry_points)


def _plugin_module(monkeypatch, name: str, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


def test_third_party_vendor_is_picked_up(monkeypatch):
    base = get_vendor("rocm-like")
    demo = Vendor("demo-like", "a third-party family reusing rocm-like seams", base.facts,
                  base.driver, base.runtime, base.library, base.compiler, base.framework)
    _plugin_module(monkeypatch, "fornax_demo_plugin", VENDOR=demo)
    _fake_entry_points(monkeypatch, [
        metadata.EntryPoint("demo-like", "fornax_demo_plugin:VENDOR", "fornax.vendors"),
        metadata.EntryPoint("ignored", "x:Y", "other.group"),
    ])
    assert stack_mod.vendor_refs()["demo-like"] == "fornax_demo_plugin:VENDOR"
    with pytest.raises(UnknownVendorError) as exc:
        make_config("nope")
    assert "demo-like" in str(exc.value)
    stack = compose(make_config("cuda-like", seams={"runtime": "demo-like"}, spec="tiny"))
    assert stack.vendors["runtime"] is demo
    g, feeds, ref = mlp()
    assert rel_err(stack.run(g, feeds).outputs[0], ref) <= 1e-4
    # a plugin cannot shadow a built-in name
    _fake_entry_points(monkeypatch, [
        metadata.EntryPoint("cuda-like", "fornax_demo_plugin:VENDOR", "fornax.vendors")])
    assert get_vendor("cuda-like") is not demo


@pytest.mark.parametrize("ref,setup", [
    ("fornax_missing_plugin_xyz:VENDOR", None),                         # not installed
    ("fornax_broken_plugin:VENDOR", "raise"),                           # import blows up
    ("fornax_broken_plugin:NOT_THERE", "module"),                       # attribute missing
    ("fornax_broken_plugin:VENDOR", "wrong-type"),                      # not a Vendor
])
def test_broken_plugin_is_a_config_error(monkeypatch, ref, setup):
    if setup == "raise":
        class Boom(types.ModuleType):
            def __getattr__(self, name):
                raise RuntimeError("plugin exploded")
        monkeypatch.setitem(sys.modules, "fornax_broken_plugin", Boom("fornax_broken_plugin"))
    elif setup == "module":
        _plugin_module(monkeypatch, "fornax_broken_plugin")
    elif setup == "wrong-type":
        _plugin_module(monkeypatch, "fornax_broken_plugin", VENDOR={"name": "broken-like"})
    _fake_entry_points(monkeypatch, [metadata.EntryPoint("broken-like", ref, "fornax.vendors")])
    cfg = make_config("cuda-like", seams={"library": "broken-like"}, spec="tiny")
    with pytest.raises(ConfigError) as exc:
        compose(cfg)
    assert "broken-like" in str(exc.value)


def test_plugin_import_error_on_import(monkeypatch, tmp_path):
    (tmp_path / "fornax_crashing_plugin.py").write_text("raise ImportError('needs libfoo.so')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake_entry_points(monkeypatch, [
        metadata.EntryPoint("crash-like", "fornax_crashing_plugin:VENDOR", "fornax.vendors")])
    with pytest.raises(ConfigError) as exc:
        get_vendor("crash-like")
    assert "libfoo" in str(exc.value)


# -- feeds ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("vendor", VENDORS)
def test_bad_feeds_are_invalid_argument(vendor):
    stack = compose(make_config(vendor, spec="tiny"))
    g, feeds, _ = mlp()
    x = feeds["x"]
    bad_feeds = [
        {},                                                   # missing
        {"y": x},                                             # wrong name
        {"x": x, "extra": x},                                 # unknown extra input
        {"x": x[:, :-1]},                                     # wrong shape
        {"x": x.reshape(-1)},                                 # wrong rank
        {"x": x.astype(np.float64)},                          # wrong dtype
        {"x": x.astype(np.int32)},
    ]
    for feed in bad_feeds:
        with pytest.raises(InvalidArgumentError):
            stack.run(g, feed)
    # and the stack still works afterwards
    g, feeds, ref = mlp()
    assert rel_err(stack.run(g, feeds).outputs[0], ref) <= 1e-4


@pytest.mark.parametrize("vendor", FAMILIES)
def test_repeated_runs_hit_the_compile_and_module_caches(vendor):
    from fornax.scenarios.workloads import mlp
    stack = compose(make_config(vendor, spec="tiny"))
    graph, feeds = mlp(0, batch=8, d_in=16, hidden=32, d_out=8)
    first = stack.run(graph, feeds).outputs[0]
    for _ in range(2):
        again = stack.run(graph, feeds).outputs[0]
        np.testing.assert_array_equal(first, again)
    assert stack.compiler.counts["graphs_compiled"] == 1
    assert stack.compiler.counts["cache_hits"] == 2
    assert stack.runtime.counts["module_cache_hits"] >= 2
