"""The framework face as data: device properties, versions, autocast and ATen routes.

A family presents its device to PyTorch the way the real stack does:
``torch.cuda.get_device_properties`` fields for cuda-like and rocm-like (rocm-like
adds ``gcnArchName``), ``torch.xpu.get_device_properties`` fields for xpu-like;
the ``torch.version`` fields it sets; the ``torch.autocast`` policy of its device
type; and the ATen ops it decomposes or runs on the CPU on purpose.  All of it
is read from the family's ``vendor.toml`` (``[framework]``,
``[framework.versions]`` and ``[framework.torch...]``) and checked here, once,
so a malformed table is a :class:`ConfigError` at compose time that names the
vendor, the table and the key.

Device property sources
-----------------------
``[framework.torch.properties]`` maps each field a framework shows to where its
value comes from.  A string is an expression of one or more references joined
by `` * `` or `` // `` (integer literals allowed); a table ``{ value = X }`` is a
literal.  References:

- ``props.<field>``: the driver's :class:`DeviceProperties` (``name``,
  ``target``, ``compute_units``, ``simd_width``, ``memory_bytes``, ``index``);
- ``native.<key>``: the driver's properties in the family's own vocabulary;
- ``spec.<field>``: the simulated chip spec (``l2_bytes``, ``registers_per_unit``...);
- ``target.<key>``: ``[framework.torch.targets.<arch>]``, per-arch facts the chip
  spec does not model (e.g. resident threads per compute unit);
- ``supports.<dtype>``: whether the chip spec gives a matrix or vector peak for
  the dtype (``has_fp64`` and friends);
- ``derived.uuid``: a stable UUID of the simulated device (its spec and index).
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Protocol

from ..sim.spec import ChipSpec
from .driver import Driver
from .errors import ConfigError, NotSupportedError

#: accelerator fields of ``torch.version`` (torch 2.13: cuda, hip, rocm, xpu); unset ones are None
TORCH_VERSION_FIELDS = ("cuda", "hip", "rocm", "xpu")

#: torch.autocast's lower-precision dtypes (torch/amp/autocast_mode.py: device_supported_dtypes)
AUTOCAST_DTYPES = ("bfloat16", "float16")

#: torch's CastPolicy names (aten/src/ATen/autocast_mode.h), plus the ops autocast refuses
CAST_POLICIES = ("lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote",
                 "banned")

#: The op lists torch 2.13 registers for both AutocastCUDA and AutocastXPU
#: (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``,
#: ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``, ``AT_FORALL_PROMOTE`` in
#: aten/src/ATen/autocast_mode.h, and the banned ``binary_cross_entropy``).  What differs per
#: device type is family data (``[framework.torch.autocast] extra``).  Names are ATen
#: overload names without the ``aten::`` namespace (``softmax.int``; the default overload bare).
TORCH_AUTOCAST: dict[str, tuple[str, ...]] = {
    "lower_precision_fp": (
        "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
        "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
        "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
        "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
        "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
        "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention"),
    "fp32": (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
        "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm", "rms_norm",
        "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
        "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
        "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
        "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
        "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa"),
    "fp32_set_opt_dtype": (
        "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
        "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
        "sum.dim_IntList"),
    "fp32_append_dtype": ("norm.Scalar", "norm.ScalarOpt_dim"),
    "promote": ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
                "index_put", "tensordot", "scatter_add"),
    "banned": ("binary_cross_entropy",),
}

_NAMESPACES = ("props", "native", "spec", "target", "supports", "derived")
_DERIVED = ("uuid",)
_PROPS = ("index", "name", "target", "compute_units", "simd_width", "memory_bytes")
_TERM = re.compile(r"^(?:\d+|[a-z]+\.[A-Za-z0-9_]+)$")


class OpOverloadLike(Protocol):
    """A torch ``OpOverload`` as far as fornax reads one: its qualified name."""

    def name(self) -> str:
        """``aten::softmax.int``-style qualified overload name."""


def aten_name(op: object) -> str:
    """An ATen overload name without namespace or ``.default``: ``aten::softmax.int`` ->
    ``softmax.int``, ``aten.mm.default`` / ``aten::mm`` / ``mm`` -> ``mm``.  Takes a string or
    anything with ``name()`` (a torch ``OpOverload``)."""
    namer = getattr(op, "name", None)
    name = str(namer()) if callable(namer) else str(op)
    for prefix in ("aten::", "aten."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.removesuffix(".default")


@dataclass(frozen=True)
class AutocastPolicy:
    """What ``torch.autocast(device_type)`` does on this family.

    ``casts`` maps ATen overload names (see :func:`aten_name`) to torch's CastPolicy:
    ``lower_precision_fp`` runs the op in the autocast dtype, the ``fp32*`` policies run it
    in float32 (``fp32`` casts inputs, ``fp32_set_opt_dtype`` sets the op's ``dtype``
    argument, ``fp32_append_dtype`` calls the dtype-taking overload), ``promote`` runs it in
    the widest input dtype, and ``banned`` ops refuse to run under autocast.
    """

    device_type: str
    dispatch_key: str                  # torch's Autocast key whose kernels these lists are
    default_dtype: str                 # torch.get_autocast_dtype(device_type)
    dtypes: tuple[str, ...]            # lower-precision dtypes the family accepts
    casts: Mapping[str, str] = field(default_factory=dict)     # read-only once parsed

    def cast(self, op: str | OpOverloadLike) -> str | None:
        """The CastPolicy of ``op`` (an overload name or OpOverload), None if autocast leaves it."""
        return self.casts.get(aten_name(op))

    def ops(self, policy: str) -> frozenset[str]:
        return frozenset(op for op, p in self.casts.items() if p == policy)

    @property
    def lower_precision(self) -> frozenset[str]:
        """Ops that run in the lower-precision dtype."""
        return self.ops("lower_precision_fp")

    @property
    def fp32(self) -> frozenset[str]:
        """Ops autocast runs in float32 (every fp32 policy)."""
        return frozenset(op for op, p in self.casts.items() if p.startswith("fp32"))

    def to_dict(self) -> dict[str, Any]:
        return {"device_type": self.device_type, "dispatch_key": self.dispatch_key,
                "default_dtype": self.default_dtype, "dtypes": list(self.dtypes),
                "ops": {p: sorted(self.ops(p)) for p in CAST_POLICIES}}


@dataclass(frozen=True)
class TorchFace:
    """A family's PyTorch face, parsed and checked from ``vendor.toml``."""

    versions: tuple[tuple[str, str | None], ...]        # every TORCH_VERSION_FIELDS entry
    properties: tuple[tuple[str, object], ...]          # field -> expression (str) or literal
    targets: dict[str, dict[str, Any]]                  # arch -> per-arch facts
    autocast: AutocastPolicy
    decompose: frozenset[str]
    fallback: dict[str, str]                            # ATen op -> reason it runs on the CPU


def _fail(vendor: str, where: str, message: str) -> ConfigError:
    return ConfigError(f"vendor.toml [{where}]: {message}", seam="framework", vendor=vendor,
                       hint=f"fix the [{where}] table of the {vendor} vendor.toml "
                            "(docs/seams/framework.md lists what it takes)")


def _str_list(value: object, vendor: str, where: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(vendor, where, f"{key} must be a list of ATen op names, got {value!r}")
    return value


def _check_expression(expr: str, vendor: str, where: str, key: str) -> None:
    terms = re.split(r" \* | // ", expr)
    for term in terms:
        if not _TERM.match(term):
            raise _fail(vendor, where, f"{key} = {expr!r}: {term!r} is neither an integer nor a "
                                       f"NAMESPACE.KEY reference ({', '.join(_NAMESPACES)})")
        if term[0].isdigit():
            continue
        ns, name = term.split(".", 1)
        if ns not in _NAMESPACES:
            raise _fail(vendor, where, f"{key} = {expr!r}: unknown source {ns!r}; sources are "
                                       f"{', '.join(_NAMESPACES)}")
        if ns == "derived" and name not in _DERIVED:
            raise _fail(vendor, where, f"{key} = {expr!r}: no derived value {name!r} (known: "
                                       f"{', '.join(_DERIVED)})")
        if ns == "props" and name not in _PROPS:
            raise _fail(vendor, where, f"{key} = {expr!r}: DeviceProperties has no {name!r} "
                                       f"({', '.join(_PROPS)})")


def parse_torch_face(framework: dict[str, Any], device_type: str, vendor: str) -> TorchFace:
    """Check and parse the torch part of a family's ``[framework]`` facts."""
    rng = framework.get("rng")
    if not isinstance(rng, str) or not rng:
        raise _fail(vendor, "framework", f"rng must name the default generator's algorithm "
                    f"(e.g. \"philox4x32-10\"), got {rng!r}")
    versions = framework.get("versions")
    if not isinstance(versions, dict) or not versions:
        raise _fail(vendor, "framework.versions", "missing: a table of the torch.version fields this "
                    f"family sets ({', '.join(TORCH_VERSION_FIELDS)})")
    unknown = sorted(set(versions) - set(TORCH_VERSION_FIELDS))
    if unknown:
        raise _fail(vendor, "framework.versions", f"unknown torch.version field(s) {', '.join(unknown)}; "
                    f"torch has {', '.join(TORCH_VERSION_FIELDS)}")
    for key, value in versions.items():
        if not isinstance(value, str) or not value:
            raise _fail(vendor, "framework.versions", f"{key} must be a version string, got {value!r}")
    torch = framework.get("torch")
    if not isinstance(torch, dict):
        raise _fail(vendor, "framework.torch", "missing: the family's PyTorch face (properties, "
                    "autocast, decompose, fallback)")
    allowed = {"properties", "targets", "autocast", "decompose", "fallback"}
    extra = sorted(set(torch) - allowed)
    if extra:
        raise _fail(vendor, "framework.torch", f"unknown key(s) {', '.join(extra)}; it takes "
                    f"{', '.join(sorted(allowed))}")

    decompose = _str_list(torch.get("decompose", []), vendor, "framework.torch", "decompose")
    fallback = torch.get("fallback", {})
    if not isinstance(fallback, dict) or not all(isinstance(r, str) and r.strip() for r in fallback.values()):
        raise _fail(vendor, "framework.torch.fallback", "must map each ATen op to the reason it runs "
                    f"on the CPU (a non-empty string), got {fallback!r}")
    fallback = {aten_name(op): reason for op, reason in fallback.items()}
    both = sorted(set(map(aten_name, decompose)) & set(fallback))
    if both:
        raise _fail(vendor, "framework.torch", f"{', '.join(both)} is both decomposed and a CPU "
                    "fallback; pick one")

    props = torch.get("properties")
    if not isinstance(props, dict) or not props:
        raise _fail(vendor, "framework.torch.properties", "missing: a table mapping each "
                    "get_device_properties field to its source")
    for key, src in props.items():
        if isinstance(src, str):
            _check_expression(src, vendor, "framework.torch.properties", key)
        elif not (isinstance(src, dict) and set(src) == {"value"}):
            raise _fail(vendor, "framework.torch.properties", f"{key} must be a source expression "
                        f"(e.g. \"spec.l2_bytes\") or {{ value = ... }}, got {src!r}")
    targets = torch.get("targets", {})
    if not isinstance(targets, dict) or not all(isinstance(t, dict) for t in targets.values()):
        raise _fail(vendor, "framework.torch.targets", "must hold one table per arch name, got "
                    f"{targets!r}")

    autocast = _parse_autocast(torch.get("autocast"), device_type, vendor)
    return TorchFace(tuple((k, versions.get(k)) for k in TORCH_VERSION_FIELDS), tuple(props.items()),
                     targets, autocast, frozenset(map(aten_name, decompose)), fallback)


def _parse_autocast(table: object, device_type: str, vendor: str) -> AutocastPolicy:
    where = "framework.torch.autocast"
    if not isinstance(table, dict):
        raise _fail(vendor, where, "missing: the family's torch.autocast policy")
    allowed = {"dispatch_key", "default_dtype", "dtypes", "extra"}
    extra_keys = sorted(set(table) - allowed)
    if extra_keys:
        raise _fail(vendor, where, f"unknown key(s) {', '.join(extra_keys)}; it takes "
                    f"{', '.join(sorted(allowed))}")
    dtypes = table.get("dtypes")
    if (not isinstance(dtypes, list) or not dtypes
            or not all(isinstance(d, str) and d in AUTOCAST_DTYPES for d in dtypes)):
        raise _fail(vendor, where, f"dtypes must be a non-empty list out of "
                    f"{', '.join(AUTOCAST_DTYPES)}, got {dtypes!r}")
    default = table.get("default_dtype")
    if default not in dtypes:
        raise _fail(vendor, where, f"default_dtype {default!r} must be one of dtypes {dtypes}")
    key = table.get("dispatch_key")
    if not isinstance(key, str) or not key.startswith("Autocast"):
        raise _fail(vendor, where, f"dispatch_key must name torch's Autocast key (e.g. AutocastCUDA), "
                    f"got {key!r}")
    casts = {op: policy for policy, ops in TORCH_AUTOCAST.items() for op in ops}
    more = table.get("extra", {})
    if not isinstance(more, dict):
        raise _fail(vendor, where, f"extra must map a CastPolicy to a list of ops, got {more!r}")
    for policy, ops in more.items():
        if policy not in CAST_POLICIES:
            raise _fail(vendor, where, f"extra.{policy}: unknown CastPolicy; torch has "
                        f"{', '.join(CAST_POLICIES)}")
        for op in _str_list(ops, vendor, where, f"extra.{policy}"):
            casts[aten_name(op)] = policy
    return AutocastPolicy(device_type, key, str(default), tuple(dtypes), MappingProxyType(casts))


def _term_value(term: str, ctx: dict[str, Any], vendor: str, key: str) -> Any:
    """The value of one term of a property expression (a property's type is the family's)."""
    if term[0].isdigit():
        return int(term)
    ns, name = term.split(".", 1)
    props = ctx["props"]
    if ns == "props":
        return getattr(props, name)
    if ns == "native":
        if name not in props.native:
            raise ConfigError(f"device property {key!r} reads native.{name}, but the driver's native "
                              f"properties have only {', '.join(sorted(props.native))}",
                              seam="framework", vendor=vendor)
        return props.native[name]
    if ns == "derived":           # only "uuid" passes the parse check
        return device_uuid(ctx["spec"]().name, props.index)
    if ns == "target":
        facts = ctx["targets"].get(props.target, {})
        if name not in facts:
            raise ConfigError(f"device property {key!r} reads target.{name}, but "
                              f"[framework.torch.targets.{props.target}] has no {name!r}",
                              seam="framework", vendor=vendor,
                              hint=f"add {name} for {props.target} to the vendor.toml, or run on a "
                                   "chip spec whose arch the table covers")
        return facts[name]
    spec = ctx["spec"]()
    if ns == "supports":
        return name in spec.matrix_peak or name in spec.vector_peak
    if not hasattr(spec, name):
        raise ConfigError(f"device property {key!r} reads spec.{name}, which chip specs do not have",
                          seam="framework", vendor=vendor)
    return getattr(spec, name)


def device_properties(face: TorchFace, driver: Driver, index: int, vendor: str) -> dict[str, Any]:
    """The dict a framework's ``get_device_properties(index)`` shows, built from the driver's
    properties and the chip spec through the family's ``[framework.torch.properties]`` table."""
    props = driver.properties(index)

    def spec() -> ChipSpec:
        get: Callable[[int], ChipSpec] | None = getattr(driver, "device_spec", None)
        if get is None:
            raise NotSupportedError("this driver exposes no chip spec (device_spec), which the "
                                    "family's device properties read", seam="framework", vendor=vendor)
        return get(index)

    ctx: dict[str, Any] = {"props": props, "spec": spec, "targets": face.targets}
    out: dict[str, Any] = {}
    for key, src in face.properties:
        if isinstance(src, dict):
            out[key] = copy.deepcopy(src["value"])      # never hand out the facts' own lists
            continue
        parts = re.split(r" (\*|//) ", str(src))
        value = _term_value(parts[0], ctx, vendor, key)
        for op, term in zip(parts[1::2], parts[2::2]):
            rhs = _term_value(term, ctx, vendor, key)
            if op == "//" and rhs == 0:
                raise ConfigError(f"device property {key!r} = {src!r} divides by zero ({term} is 0)",
                                  seam="framework", vendor=vendor)
            value = value * rhs if op == "*" else value // rhs
        out[key] = copy.deepcopy(value)
    return out


def device_uuid(spec_name: str, index: int) -> str:
    """The stable UUID of simulated device ``index`` of chip spec ``spec_name`` (what the
    face's ``derived.uuid`` property and the family's device tools show)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fornax:{spec_name}:{index}"))
