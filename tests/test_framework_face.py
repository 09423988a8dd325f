"""The framework seam's face per family: device properties, versions, autocast, ATen routes.

Every device property is checked against the driver or chip-spec figure it comes from;
versions and autocast against what the pinned PyTorch itself reports (its ``torch.version``
fields, ``torch.get_autocast_dtype``, the ops it registers for AutocastCUDA/AutocastXPU, and
what those kernels really do to dtypes, run on fake "cuda"/"xpu" tensors).
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch._decomp import decomposition_table
from torch._subclasses.fake_tensor import FakeTensorMode

from fornax.cli.main import main
from fornax.contracts.suites import run_suite
from fornax.layers.compiler import Target
from fornax.layers.errors import ConfigError, NotSupportedError
from fornax.layers.face import aten_name
from fornax.layers.framework import Framework, FrameworkBase
from fornax.vendors import load_facts
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor
from helpers import FAMILIES

#: torch's _CudaDeviceProperties fields the cuda face shows (rocm-like adds gcnArchName)
CUDA_FIELDS = {"name", "major", "minor", "total_memory", "multi_processor_count", "L2_cache_size",
               "warp_size", "max_threads_per_multi_processor", "regs_per_multiprocessor", "uuid"}
#: torch's _XpuDeviceProperties fields the xpu face shows
XPU_FIELDS = {"name", "platform_name", "vendor", "driver_version", "version", "type", "total_memory",
              "max_compute_units", "gpu_eu_count", "gpu_subslice_count", "max_work_group_size",
              "max_num_sub_groups", "sub_group_sizes", "has_fp16", "has_fp64", "has_atomic64", "uuid"}


def build(vendor: str, spec="tiny", devices: int = 2):
    """A family's driver and framework on fresh simulated devices of ``spec``."""
    spec = load_spec(spec) if isinstance(spec, str) else spec
    v = get_vendor(vendor)
    drv = v.driver([Device(spec, i) for i in range(devices)])
    rt = v.runtime(drv)
    comp = v.compiler()
    p = drv.properties(0)
    fmt = next(f for f in comp.output_formats() if f in drv.loadable_formats(0))
    return drv, v.framework(comp, v.library(rt), rt, Target(p.target, fmt, p.compute_units))


# == device properties ========================================================================
@pytest.mark.parametrize("spec", ["h200-like", "mi300x-like", "tiny"])
@pytest.mark.parametrize("vendor", ["cuda-like", "rocm-like"])
def test_cuda_face_properties_come_from_the_driver_and_the_spec(vendor, spec):
    drv, fw = build(vendor, spec)
    s, props = drv.device_spec(0), drv.properties(0)
    p = fw.device_properties(drv, 0)
    assert set(p) == CUDA_FIELDS | ({"gcnArchName"} if vendor == "rocm-like" else set())
    assert p["name"] == props.native["name"]
    assert p["total_memory"] == s.hbm_bytes
    assert p["multi_processor_count"] == s.compute_units
    assert p["L2_cache_size"] == s.l2_bytes
    assert p["regs_per_multiprocessor"] == s.registers_per_unit
    assert p["max_threads_per_multi_processor"] == 2048      # sm_70/80/90, gfx90a/942: public figure
    target = props.target
    if vendor == "cuda-like":
        assert p["warp_size"] == 32
        assert (p["major"], p["minor"]) == (int(target[3:-1]), int(target[-1]))    # sm_90 -> 9.0
    else:
        assert p["warp_size"] == 64                          # wavefront 64, whatever the spec says
        digits = target.removeprefix("gfx")                  # gfx942 -> 9.4, gfx90a -> 9.0
        assert (p["major"], p["minor"]) == (int(digits[:-2]), int(digits[-2], 16))
        assert p["gcnArchName"] == target + ":sramecc+:xnack-"


def test_rocm_like_gcn_arch_name_on_an_mi300x_like_device():
    drv, fw = build("rocm-like", "mi300x-like")
    assert fw.device_properties(drv)["gcnArchName"] == "gfx942:sramecc+:xnack-"


def test_uuid_names_the_device_not_the_family():
    ids = {}
    for vendor in FAMILIES:
        drv, fw = build(vendor, "h200-like")
        ids[vendor] = (fw.device_properties(drv, 0)["uuid"], fw.device_properties(drv, 1)["uuid"])
    first, second = ids["cuda-like"]
    assert uuid.UUID(first) and first != second              # two devices, two UUIDs
    assert set(ids.values()) == {(first, second)}            # the same hardware under every face
    drv, fw = build("cuda-like", "tiny")
    assert fw.device_properties(drv, 0)["uuid"] != first     # another chip, another UUID


@pytest.mark.parametrize("spec", ["max1550-like", "tiny"])
def test_xpu_face_properties_come_from_the_driver_and_the_spec(spec):
    drv, fw = build("xpu-like", spec)
    s, props = drv.device_spec(0), drv.properties(0)
    p = fw.device_properties(drv, 0)
    assert set(p) == XPU_FIELDS
    eus_per_core = {"pvc": 8, "dg2": 16}[props.target]      # Xe-HPC / Xe-HPG vector engines per core
    assert p["name"] == props.native["name"]
    assert p["total_memory"] == s.hbm_bytes
    assert p["gpu_subslice_count"] == s.compute_units
    assert p["gpu_eu_count"] == p["max_compute_units"] == s.compute_units * eus_per_core
    assert p["max_work_group_size"] == s.max_group_size
    assert p["max_num_sub_groups"] == s.max_group_size // 16          # sub-group 16
    assert p["sub_group_sizes"] == [16, 32] == props.native["subGroupSizes"]
    assert p["has_fp16"] is True and p["has_fp64"] is ("float64" in s.vector_peak)
    assert p["version"] == {"pvc": "12.60.7", "dg2": "12.55.8"}[props.target]
    assert p["type"] == "gpu" and p["has_atomic64"] is True
    p["sub_group_sizes"].append(8)                           # a caller's dict is its own
    assert fw.device_properties(drv, 0)["sub_group_sizes"] == [16, 32]


def test_xpu_has_fp64_follows_the_chip_spec():
    s = load_spec("max1550-like")
    no_fp64 = replace(s, vector_peak={k: v for k, v in s.vector_peak.items() if k != "float64"},
                      matrix_peak={k: v for k, v in s.matrix_peak.items() if k != "float64"})
    drv, fw = build("xpu-like", no_fp64)
    assert fw.device_properties(drv)["has_fp64"] is False
    assert fw.device_properties(drv)["has_fp16"] is True


def test_a_target_the_table_does_not_cover_names_the_missing_fact():
    drv, fw = build("rocm-like", replace(load_spec("tiny"), name="rx6700-like"))   # -> gfx1031
    with pytest.raises(ConfigError) as exc:
        fw.device_properties(drv, 0)
    assert "max_threads_per_multi_processor" in exc.value.message and "gfx1031" in exc.value.message


# == versions and the rest of the face =========================================================
def test_version_fields_are_torchs():
    torch_fields = set(torch.version.__all__) - {"__version__", "debug", "git_version"}
    for vendor in FAMILIES:
        assert set(build(vendor)[1].versions()) == torch_fields


def test_rocm_like_poses_as_cuda_and_reports_hip():
    _, fw = build("rocm-like")
    v = fw.versions()
    assert fw.face.device_type == "cuda" and fw.face.module == "torch.cuda"
    assert v["cuda"] is None and v["hip"] and v["xpu"] is None
    assert fw.face.dist_backend == "nccl"
    _, cuda = build("cuda-like")
    assert cuda.versions()["cuda"] == "12.8" and cuda.versions()["hip"] is None
    _, xpu = build("xpu-like")
    assert xpu.versions()["xpu"] and xpu.versions()["cuda"] is None and xpu.face.device_type == "xpu"


@pytest.mark.parametrize("vendor", FAMILIES)
def test_report_carries_versions_rng_and_autocast_dtype(vendor):
    _, fw = build(vendor)
    rep = fw.report()
    assert rep["versions"] == fw.versions()
    assert rep["autocast_dtype"] == fw.autocast_policy().default_dtype
    assert rep["rng"] == "philox4x32-10"
    assert rep[f"version.{fw.face.version_field}"] == fw.versions()[fw.face.version_field]
    assert isinstance(fw, Framework)


# == autocast =================================================================================
@pytest.mark.parametrize("vendor", FAMILIES)
def test_autocast_default_dtype_is_torchs(vendor):
    _, fw = build(vendor)
    pol = fw.autocast_policy()
    assert pol.device_type == fw.face.device_type
    assert pol.default_dtype == str(torch.get_autocast_dtype(pol.device_type)).removeprefix("torch.")
    assert set(pol.dtypes) == {"float16", "bfloat16"}
    if vendor == "cuda-like":
        assert pol.default_dtype == "float16"


def _registered(key: str) -> set[str]:
    return {aten_name(n) for n in torch._C._dispatch_get_all_op_names()
            if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)}


@pytest.mark.parametrize("vendor", FAMILIES)
def test_autocast_lists_are_exactly_the_ops_torch_registers(vendor):
    pol = build(vendor)[1].autocast_policy()
    assert set(pol.casts) == _registered(pol.dispatch_key)


def test_autocast_lists_differ_where_torchs_do():
    cuda = build("cuda-like")[1].autocast_policy()
    xpu = build("xpu-like")[1].autocast_policy()
    rocm = build("rocm-like")[1].autocast_policy()
    torch_diff = _registered("AutocastCUDA") ^ _registered("AutocastXPU")
    assert torch_diff and set(cuda.casts) ^ set(xpu.casts) == torch_diff
    assert cuda.lower_precision - xpu.lower_precision == {"cudnn_convolution", "cudnn_convolution_transpose"}
    assert rocm.casts == cuda.casts                          # HIP registers the same AutocastCUDA lists


def _x(*shape, dtype=torch.float32, device="cuda"):
    return torch.empty(*shape, dtype=dtype, device=device)


#: (ATen overload, call on fake tensors of ``device`` and ``dtype``) for ops across the categories
CALLS = {
    "mm": lambda d, t: torch.mm(_x(4, 8, dtype=t, device=d), _x(8, 4, dtype=t, device=d)),
    "addmm": lambda d, t: torch.addmm(_x(4, 4, dtype=t, device=d), _x(4, 8, dtype=t, device=d),
                                      _x(8, 4, dtype=t, device=d)),
    "bmm": lambda d, t: torch.bmm(_x(2, 4, 8, dtype=t, device=d), _x(2, 8, 4, dtype=t, device=d)),
    "baddbmm": lambda d, t: torch.baddbmm(_x(2, 4, 4, dtype=t, device=d), _x(2, 4, 8, dtype=t, device=d),
                                          _x(2, 8, 4, dtype=t, device=d)),
    "matmul": lambda d, t: torch.matmul(_x(4, 8, dtype=t, device=d), _x(8, 4, dtype=t, device=d)),
    "linear": lambda d, t: F.linear(_x(4, 8, dtype=t, device=d), _x(3, 8, dtype=t, device=d)),
    "conv2d": lambda d, t: F.conv2d(_x(1, 2, 6, 6, dtype=t, device=d), _x(3, 2, 3, 3, dtype=t, device=d)),
    "conv_transpose2d.input": lambda d, t: F.conv_transpose2d(_x(1, 2, 4, 4, dtype=t, device=d),
                                                              _x(2, 3, 3, 3, dtype=t, device=d)),
    "prelu": lambda d, t: F.prelu(_x(2, 3, dtype=t, device=d), _x(1, dtype=t, device=d)),
    "scaled_dot_product_attention": lambda d, t: F.scaled_dot_product_attention(
        _x(1, 2, 4, 8, dtype=t, device=d), _x(1, 2, 4, 8, dtype=t, device=d), _x(1, 2, 4, 8, dtype=t, device=d)),
    "softmax.int": lambda d, t: torch.softmax(_x(2, 8, dtype=t, device=d), -1),
    "log_softmax.int": lambda d, t: torch.log_softmax(_x(2, 8, dtype=t, device=d), -1),
    "layer_norm": lambda d, t: F.layer_norm(_x(2, 8, dtype=t, device=d), (8,)),
    "group_norm": lambda d, t: F.group_norm(_x(2, 4, 3, dtype=t, device=d), 2),
    "rms_norm": lambda d, t: F.rms_norm(_x(2, 8, dtype=t, device=d), (8,)),
    "exp": lambda d, t: torch.exp(_x(4, dtype=t, device=d)),
    "log": lambda d, t: torch.log(_x(4, dtype=t, device=d)),
    "pow.Tensor_Scalar": lambda d, t: torch.pow(_x(4, dtype=t, device=d), 2),
    "sum": lambda d, t: torch.sum(_x(4, dtype=t, device=d)),
    "prod": lambda d, t: torch.prod(_x(4, dtype=t, device=d)),
    "cumsum": lambda d, t: torch.cumsum(_x(4, dtype=t, device=d), 0),
    "mse_loss": lambda d, t: F.mse_loss(_x(4, dtype=t, device=d), _x(4, dtype=t, device=d)),
    "binary_cross_entropy_with_logits": lambda d, t: F.binary_cross_entropy_with_logits(
        _x(4, dtype=t, device=d), _x(4, dtype=t, device=d)),
    "norm.Scalar": lambda d, t: torch.ops.aten.norm.Scalar(_x(4, dtype=t, device=d), 2),
    "relu": lambda d, t: torch.relu(_x(4, dtype=t, device=d)),
    "add.Tensor": lambda d, t: torch.add(_x(4, dtype=t, device=d), _x(4, dtype=t, device=d)),
}


@pytest.mark.parametrize("vendor", ["cuda-like", "xpu-like"])
def test_autocast_policy_is_what_torchs_autocast_kernels_do(vendor):
    """Run torch's own Autocast kernels on fake tensors of the family's device type: an op the
    policy lowers turns float32 into the autocast dtype, an fp32 op turns float16 into float32,
    an op the policy leaves alone keeps its dtype."""
    pol = build(vendor)[1].autocast_policy()
    dev = pol.device_type
    low = getattr(torch, pol.default_dtype)
    with FakeTensorMode():
        torch.set_autocast_enabled(dev, True)
        torch.set_autocast_dtype(dev, low)
        try:
            for op, call in CALLS.items():
                if dev == "xpu" and op == "scaled_dot_product_attention":
                    continue      # a CPU build of torch has no XPU sdp-backend stub to pick a kernel
                cast = pol.cast(op)
                if cast == "lower_precision_fp":
                    assert call(dev, torch.float32).dtype == low, op
                elif cast is not None and cast.startswith("fp32"):
                    assert call(dev, torch.float16).dtype == torch.float32, op
                else:
                    assert cast is None, op
                    assert call(dev, torch.float16).dtype == torch.float16, op
                    assert call(dev, torch.float32).dtype == torch.float32, op
            assert pol.cast("atan2") == "promote"
            mixed = torch.atan2(_x(4, dtype=torch.float16, device=dev), _x(4, device=dev))
            assert mixed.dtype == torch.float32          # promote: the widest input wins
            assert pol.cast("binary_cross_entropy") == "banned"
            with pytest.raises(RuntimeError, match="unsafe to autocast"):
                F.binary_cross_entropy(_x(4, device=dev), _x(4, device=dev))
        finally:
            torch.set_autocast_enabled(dev, False)
    lowered = {op for op in CALLS if pol.cast(op) == "lower_precision_fp"}
    assert {"mm", "addmm", "bmm", "linear", "conv2d", "scaled_dot_product_attention"} <= lowered
    assert {"softmax.int", "layer_norm", "exp", "sum", "mse_loss"} <= pol.fp32


def test_autocast_lookup_takes_overload_names_and_opoverloads():
    pol = build("cuda-like")[1].autocast_policy()
    assert pol.cast("aten::mm") == pol.cast("aten::mm.default") == pol.cast(torch.ops.aten.mm.default)
    assert pol.cast(torch.ops.aten.softmax.int) == "fp32_set_opt_dtype"
    assert pol.cast("aten::softmax") is None                 # overloads match exactly
    d = pol.to_dict()
    assert d["default_dtype"] == "float16" and "mm" in d["ops"]["lower_precision_fp"]


# == ATen routes ==============================================================================
def test_torch_route_answers_from_the_tables():
    _, xpu = build("xpu-like")
    for name in ("aten::_softmax", "aten::_softmax.default", "_softmax", torch.ops.aten._softmax.default):
        r = xpu.torch_route(name)
        assert r.kind == "decomposed" and r.op == "aten::_softmax"
    assert xpu.torch_route("aten::mean.dim").kind == "decomposed"
    assert xpu.torch_route("aten::mean") is None             # only the .dim overload is listed
    fb = xpu.torch_route(torch.ops.aten.linalg_eig.default)
    assert fb.kind == "fallback" and "CPU" in fb.reason
    assert "XPUFallback" in fb.reason                        # the vendor.toml reason travels
    assert xpu.torch_route("aten::mm") is None
    for vendor in ("cuda-like", "rocm-like"):
        fw = build(vendor)[1]
        assert fw.torch_route("aten::_softmax") is None and fw.torch_route("aten::linalg_eig") is None


@pytest.mark.parametrize("vendor", FAMILIES)
def test_routed_ops_are_real_aten_ops_and_decompositions_exist(vendor):
    tf = build(vendor)[1].torch_face
    by_name = {op.name(): op for op in decomposition_table}
    for name in tf.decompose:
        assert f"aten::{name}" in by_name, f"PyTorch has no decomposition for aten::{name}"
    names = set(torch._C._dispatch_get_all_op_names())
    for name in tf.fallback:
        assert f"aten::{name}" in names, name


# == bad vendor.toml ==========================================================================
CUDA_TOML = (Path(__file__).parents[1] / "fornax/vendors/cuda_like/vendor.toml").read_text()


@pytest.mark.parametrize("old, new, says", [
    ("decompose = []", 'decompose = "aten::_softmax"', "decompose must be a list"),
    ("[framework.torch.fallback]                   # ATen op -> why it runs on the CPU on purpose: none",
     '[framework.torch.fallback]\n"aten::cholesky" = ""', "framework.torch.fallback"),
    ('L2_cache_size = "spec.l2_bytes"', 'L2_cache_size = "gpu.l2"', "unknown source 'gpu'"),
    ('L2_cache_size = "spec.l2_bytes"', "L2_cache_size = 5", "L2_cache_size must be a source"),
    ('default_dtype = "float16"', 'default_dtype = "float8_e4m3fn"', "default_dtype"),
    ("decompose = []", "decompose = []\nkernels = 3", "unknown key(s) kernels"),
    ("decompose = []", 'decompose = ["aten::cholesky"]\n[framework.torch.fallback]\n'
     '"aten::cholesky" = "no solver"\n[framework.torch.x]', "both decomposed and a CPU fallback"),
    ('cuda = "12.8"', 'cuda = "12.8"\ncudnn = "9.1"', "unknown torch.version field(s) cudnn"),
    ('rng = "philox4x32-10"', "", "rng must name"),
    ('version_field = "cuda"', 'version_field = "hip"', "version_field 'hip' is not set"),
])
def test_a_malformed_face_table_is_a_config_error(tmp_path, monkeypatch, old, new, says):
    assert old in CUDA_TOML
    text = CUDA_TOML.replace(old, new, 1)
    if "[framework.torch.x]" in new:                         # drop the original (now duplicate) table
        text = text.replace("[framework.torch.fallback]                   # ATen op -> why it runs on "
                            "the CPU on purpose: none\n", "").replace("[framework.torch.x]", "")
    pkg = tmp_path / "fx_badface"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "vendor.toml").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fx_badface", raising=False)   # each case its own package
    facts = load_facts("fx_badface")
    bad = type("BadFramework", (FrameworkBase,), {"vendor": "bad-like", "facts": facts})
    with pytest.raises(ConfigError) as exc:
        bad(None, None, None, None)
    assert says in exc.value.message
    assert exc.value.vendor == "bad-like" and exc.value.seam == "framework"


# == the null template ========================================================================
def test_null_framework_keeps_the_protocol_and_raises_not_implemented():
    fw = get_vendor("null").framework(None, None, None, None)
    members = {n for n in vars(Framework) if not n.startswith("_")} | set(Framework.__annotations__)
    assert {"torch_route", "device_properties", "versions", "autocast_policy"} <= members
    assert all(n in dir(type(fw)) for n in members)      # the template keeps the Protocol's shape
    for hook, call in [("torch_route", lambda: fw.torch_route("aten::mm")),
                       ("device_properties", lambda: fw.device_properties(None)),
                       ("versions", fw.versions), ("autocast_policy", fw.autocast_policy)]:
        with pytest.raises(NotSupportedError, match=f"not implemented: framework.{hook}"):
            call()


# == the framework conformance suite ==========================================================
@pytest.mark.parametrize("vendor", FAMILIES)
def test_builtin_families_pass_the_framework_suite(vendor):
    results = run_suite("framework", get_vendor(vendor))
    assert len(results) >= 5 and all(r.passed for r in results), [r.line() for r in results]


def test_null_fails_every_framework_clause_naming_a_hook():
    results = run_suite("framework", get_vendor("null"))
    assert results and all(not r.passed and "not implemented: " in r.line() for r in results)


def test_cli_conform_knows_the_framework_suite():
    r = CliRunner().invoke(main, ["conform", "framework", "--vendor", "rocm-like"])
    assert r.exit_code == 0 and r.stdout.count("PASS framework F0") >= 5
