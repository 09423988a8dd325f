"""The device's one tile-level ISA.

A kernel is a :class:`Program`: typed parameters and a list of instructions
over named registers.  Each register holds a *tile* per program instance; the
executor (``execute.py``) runs every instance of a grid at once, so a register
is a numpy array of shape ``(instances, *tile_shape)`` (or ``(1, *tile_shape)``
when it is the same for every instance).

Vendor binaries carry a program in their own container; the driver's loader
decodes the container back into a :class:`Program`.  Two encodings of a
program are defined here, once: a compact JSON form and a readable assembly
text (the dialect-neutral listing :func:`disassemble` prints; the vendor
families print their own dialects through ``fornax.layers.dialect``).  Both decode through :func:`verify`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import ml_dtypes
import numpy as np

from .faults import InvalidProgram

DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "bool": np.dtype(np.bool_),
}

UNARY: tuple[str, ...] = ("neg", "exp", "log", "relu", "tanh", "sqrt", "rsqrt", "abs", "sigmoid", "recip", "not",
         "erf", "floor", "ceil", "round", "sign", "isnan")
BINARY: tuple[str, ...] = ("add", "sub", "mul", "div", "max", "min", "pow", "floordiv", "mod",
          "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "atan2")
#: unary / binary functions whose result is bool whatever the operand dtype
BOOL_RESULT = ("not", "isnan", "lt", "le", "gt", "ge", "eq", "ne", "and", "or")
REDUCE = ("sum", "max", "min")
#: reductions that give the int64 index (along the axis) of the first extreme element
ARG_REDUCE = ("argmax", "argmin")
#: integer bit operations (counter-based RNG, hashing): on integer tiles only
BITWISE = ("bitand", "bitor", "xor", "shl", "shr")
#: trigonometric functions (Box-Muller normals)
TRIG = ("sin", "cos")
UNARY = UNARY + TRIG
#: ``tf32``: round a float32 tile to TF32 (10-bit mantissa, nearest, ties away from zero, as
#: ``cvt.rna.tf32.f32``); a ``dot`` whose operands both come from it runs the TF32 matrix path
TF32 = ("tf32",)
UNARY = UNARY + TF32
BINARY = BINARY + BITWISE


def np_dtype(name: str) -> np.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InvalidProgram(f"unknown dtype {name!r}; the ISA knows {', '.join(DTYPES)}") from None


@dataclass(frozen=True)
class Param:
    name: str
    kind: str            # "ptr" (a device address of `dtype` elements) or "scalar"
    dtype: str


# ---- instructions ----------------------------------------------------------
@dataclass(frozen=True)
class ProgramId:
    dst: str
    axis: int = 0
    op = "program_id"


@dataclass(frozen=True)
class Arange:
    dst: str
    n: int
    op = "arange"


@dataclass(frozen=True)
class Const:
    dst: str
    value: float | int | bool
    dtype: str
    op = "const"


@dataclass(frozen=True)
class ScalarArg:
    dst: str
    param: str
    op = "scalar"


@dataclass(frozen=True)
class Unary:
    dst: str
    fn: str
    src: str
    op = "unary"


@dataclass(frozen=True)
class Binary:
    dst: str
    fn: str
    a: str
    b: str
    op = "binary"


@dataclass(frozen=True)
class Where:
    dst: str
    cond: str
    a: str
    b: str
    op = "where"


@dataclass(frozen=True)
class Convert:
    dst: str
    src: str
    dtype: str
    op = "convert"


@dataclass(frozen=True)
class Reshape:
    dst: str
    src: str
    shape: tuple[int, ...]
    op = "reshape"


@dataclass(frozen=True)
class Broadcast:
    dst: str
    src: str
    shape: tuple[int, ...]
    op = "broadcast"


@dataclass(frozen=True)
class Reduce:
    dst: str
    fn: str
    src: str
    axis: int
    op = "reduce"


@dataclass(frozen=True)
class Load:
    dst: str
    ptr: str
    offsets: str
    mask: str | None = None
    other: float = 0.0
    op = "load"


@dataclass(frozen=True)
class Store:
    ptr: str
    offsets: str
    value: str
    mask: str | None = None
    op = "store"


@dataclass(frozen=True)
class StoreReduce:
    """Deterministic cross-instance reduction into memory.

    Every active lane of every instance contributes ``value`` to the element
    at its offset; contributions to one element are combined with ``fn`` in
    instance order (then lane order) and finally with the element's prior
    contents, so the result is the same on every run, unlike a float atomic.
    """

    ptr: str
    offsets: str
    value: str
    fn: str = "sum"
    mask: str | None = None
    op = "store_reduce"


@dataclass(frozen=True)
class Dot:
    dst: str
    a: str
    b: str
    acc: str
    acc_dtype: str = "float32"
    op = "dot"


@dataclass(frozen=True)
class SparseDot:
    """``dst = acc + expand(a, e) @ b``: the 2:4 structured-sparse matrix multiply-accumulate.

    ``a`` is a ``[M, K/2]`` tile of the kept values of a 2:4-sparse ``[M, K]`` operand (two
    of every four along K, in K order); ``e`` is its metadata, an int32 ``[M, ceil(K/32)]``
    tile: word ``w`` of a row holds the 2-bit positions (0..3 inside their group of four) of
    kept values ``16 w .. 16 w + 15``, value ``j`` in bits ``2 (j % 16)`` and up.  ``b`` is a
    dense ``[K, N]`` tile.  The result is exactly :class:`Dot` of the dense operand whose
    group ``g`` holds kept values ``2g`` and ``2g + 1`` at their positions and zeros
    elsewhere (a position named twice keeps the later value); the matrix unit counts the
    dense-equivalent work ``2 M N K``, which a chip with a sparse matrix instruction runs at
    its ``sparse_matrix_peak``.
    """

    dst: str
    a: str
    e: str
    b: str
    acc: str
    acc_dtype: str = "float32"
    op = "sparse_dot"


#: kept values per metadata word of a :class:`SparseDot` (2 bits each in an int32)
SPARSE_VALUES_PER_WORD = 16
#: dense K columns one metadata word covers (two kept values per group of four)
SPARSE_K_PER_WORD = 2 * SPARSE_VALUES_PER_WORD


@dataclass(frozen=True)
class Barrier:
    op = "barrier"


@dataclass(frozen=True)
class Loop:
    var: str
    start: int
    stop: int | str          # a bound, or a register holding one uniform bound
    step: int
    body: tuple[Instruction, ...] = ()
    op = "loop"


#: one instruction of the ISA
Instruction = (ProgramId | Arange | Const | ScalarArg | Unary | Binary | Where | Convert | Reshape | Broadcast
               | Reduce | Load | Store | StoreReduce | Dot | SparseDot | Barrier | Loop)
#: an operand of an instruction in assembly text: a register or name, a number, a flag, a shape or none
Operand = str | int | float | bool | tuple[int, ...] | None

INSTRUCTIONS: dict[str, type[Instruction]] = {cls.op: cls for cls in (ProgramId, Arange, Const, ScalarArg, Unary, Binary, Where,
                                        Convert, Reshape, Broadcast, Reduce, Load, Store, StoreReduce, Dot,
                                        SparseDot, Barrier, Loop)}


@dataclass(frozen=True)
class Program:
    name: str
    params: tuple[Param, ...]
    body: tuple[Instruction, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise InvalidProgram(f"kernel {self.name}: no parameter named {name!r}")

    def instructions(self) -> Iterator[Instruction]:
        """Every instruction, loop bodies included (depth first)."""
        stack = list(reversed(self.body))
        while stack:
            ins = stack.pop()
            yield ins
            if isinstance(ins, Loop):
                stack.extend(reversed(ins.body))


# ---- verification ------------------------------------------------------------
#: the register operands of each instruction that reads registers (field names)
OPERANDS: dict[type, tuple[str, ...]] = {
    Unary: ("src",), Binary: ("a", "b"), Where: ("cond", "a", "b"), Convert: ("src",),
    Reshape: ("src",), Broadcast: ("src",), Reduce: ("src",), Load: ("offsets", "mask"),
    Store: ("offsets", "value", "mask"), StoreReduce: ("offsets", "value", "mask"),
    Dot: ("a", "b", "acc"), SparseDot: ("a", "e", "b", "acc"),
}


def _reads(ins: object) -> list[str]:
    return [getattr(ins, n) for n in OPERANDS.get(type(ins), ()) if getattr(ins, n) is not None]


def verify(program: Program) -> Program:
    """Check a program is well formed; raise :class:`InvalidProgram` naming the first problem.
    (Tile shapes and dtypes are checked by :func:`fornax.sim.verify.check_types` when a driver
    loads the module.)"""
    try:
        return _verify(program)
    except TypeError as exc:
        # an operand of the wrong type (a list as a register name, an int as a shape, ...),
        # e.g. from a corrupted binary: still a malformed program, never a crash
        raise InvalidProgram(f"kernel {program.name!r}: malformed operand ({exc})") from None


def _verify(program: Program) -> Program:
    where = f"kernel {program.name!r}"
    if not program.name or not isinstance(program.name, str):
        raise InvalidProgram("kernel has no name")
    seen = set()
    for p in program.params:
        if p.kind not in ("ptr", "scalar"):
            raise InvalidProgram(f"{where}: parameter {p.name!r} has unknown kind {p.kind!r}")
        np_dtype(p.dtype)
        if p.name in seen:
            raise InvalidProgram(f"{where}: parameter {p.name!r} declared twice")
        seen.add(p.name)
    params = {p.name: p for p in program.params}

    def check(body: Iterable[object], defined: set[str]) -> None:
        for i, ins in enumerate(body):
            loc = f"{where}, instruction {i} ({getattr(ins, 'op', type(ins).__name__)})"
            if type(ins) not in INSTRUCTIONS.values():
                raise InvalidProgram(f"{loc}: not an ISA instruction: {ins!r}")
            for reg in _reads(ins):
                if reg not in defined:
                    raise InvalidProgram(f"{loc}: reads register {reg} before it is written")
            if isinstance(ins, StoreReduce) and ins.fn not in REDUCE:
                raise InvalidProgram(f"{loc}: unknown reduction {ins.fn!r}")
            if isinstance(ins, (Load, Store, StoreReduce)):
                p = params.get(ins.ptr)
                if p is None or p.kind != "ptr":
                    raise InvalidProgram(f"{loc}: {ins.ptr!r} is not a pointer parameter")
            if isinstance(ins, ScalarArg):
                p = params.get(ins.param)
                if p is None or p.kind != "scalar":
                    raise InvalidProgram(f"{loc}: {ins.param!r} is not a scalar parameter")
            if isinstance(ins, Unary) and ins.fn not in UNARY:
                raise InvalidProgram(f"{loc}: unknown unary function {ins.fn!r}")
            if isinstance(ins, Binary) and ins.fn not in BINARY:
                raise InvalidProgram(f"{loc}: unknown binary function {ins.fn!r}")
            if isinstance(ins, Reduce) and ins.fn not in REDUCE + ARG_REDUCE:
                raise InvalidProgram(f"{loc}: unknown reduction {ins.fn!r}")
            if isinstance(ins, (Const, Convert)):
                np_dtype(ins.dtype)
            if isinstance(ins, Const) and not isinstance(ins.value, (int, float, bool)):
                raise InvalidProgram(f"{loc}: constant must be a number, got {ins.value!r}")
            if isinstance(ins, (Dot, SparseDot)):
                np_dtype(ins.acc_dtype)
            if isinstance(ins, ProgramId) and ins.axis not in (0, 1, 2):
                raise InvalidProgram(f"{loc}: program_id axis must be 0, 1 or 2, got {ins.axis}")
            if isinstance(ins, Arange) and not (isinstance(ins.n, int) and ins.n > 0):
                raise InvalidProgram(f"{loc}: arange length must be a positive integer")
            if isinstance(ins, (Reshape, Broadcast)) and not all(
                    isinstance(d, int) and d > 0 for d in ins.shape):
                raise InvalidProgram(f"{loc}: shape must be positive integers, got {ins.shape}")
            if isinstance(ins, Loop):
                if isinstance(ins.stop, str) and ins.stop not in defined:
                    raise InvalidProgram(f"{loc}: loop bound reads register {ins.stop} before it is written")
                if not all(isinstance(v, int) for v in (ins.start, ins.step)) or ins.step == 0 or \
                        not isinstance(ins.stop, (int, str)):
                    raise InvalidProgram(f"{loc}: loop bounds must be integers with a non-zero step")
                check(ins.body, defined | {ins.var})
            elif hasattr(ins, "dst"):
                defined.add(ins.dst)

    check(program.body, set())
    return program


# ---- JSON encoding --------------------------------------------------------------
def _ins_to_obj(ins: Instruction) -> dict[str, Any]:
    obj: dict[str, Any] = {"op": ins.op}
    for f in fields(ins):
        v = getattr(ins, f.name)
        obj[f.name] = [_ins_to_obj(b) for b in v] if f.name == "body" else v
    return obj


def _ins_from_obj(obj: object) -> Instruction:
    if not isinstance(obj, dict) or obj.get("op") not in INSTRUCTIONS:
        raise InvalidProgram(f"not an ISA instruction: {str(obj)[:80]}")
    cls = INSTRUCTIONS[obj["op"]]
    kwargs = {k: v for k, v in obj.items() if k != "op"}
    if "body" in kwargs:
        kwargs["body"] = tuple(_ins_from_obj(b) for b in kwargs["body"])
    if "shape" in kwargs and isinstance(kwargs["shape"], list):
        kwargs["shape"] = tuple(kwargs["shape"])
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidProgram(f"malformed {obj['op']} instruction: {exc}") from None


def encode(program: Program) -> bytes:
    obj = {"name": program.name, "params": [asdict(p) for p in program.params],
           "body": [_ins_to_obj(i) for i in program.body], "meta": program.meta}
    return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()


def decode(data: bytes) -> Program:
    try:
        obj = json.loads(data.decode())
        params = tuple(Param(**p) for p in obj["params"])
        body = tuple(_ins_from_obj(i) for i in obj["body"])
        program = Program(obj["name"], params, body, dict(obj.get("meta", {})))
    except InvalidProgram:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidProgram(f"cannot decode kernel program: {type(exc).__name__}: {exc}") from None
    return verify(program)


# ---- assembly text -----------------------------------------------------------------
def _fmt(v: object) -> str:
    if v is None:
        return "_"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "(" + ",".join(str(x) for x in v) + ")"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _parse(tok: str, where: str) -> Operand:
    if tok == "_":
        return None
    if tok in ("true", "false"):
        return tok == "true"
    if tok.startswith("(") and tok.endswith(")"):
        inner = tok[1:-1]
        try:
            return tuple(int(x) for x in inner.split(",") if x)
        except ValueError:
            raise InvalidProgram(f"{where}: bad shape {tok!r}") from None
    for conv in (int, float):
        try:
            return conv(tok)
        except ValueError:
            pass
    return tok


def disassemble(program: Program) -> str:
    """Readable assembly; :func:`assemble` reads it back."""
    lines = [f".kernel {program.name}"]
    for p in program.params:
        lines.append(f".param {p.name} {p.kind} {p.dtype}")
    if program.meta:
        lines.append(f".meta {json.dumps(program.meta, sort_keys=True, separators=(',', ':'))}")

    def emit(body: Iterable[Instruction], depth: int) -> None:
        pad = "  " * depth
        for ins in body:
            args = " ".join(f"{f.name}={_fmt(getattr(ins, f.name))}" for f in fields(ins)
                            if f.name != "body")
            if isinstance(ins, Loop):
                lines.append(f"{pad}loop {args} {{")
                emit(ins.body, depth + 1)
                lines.append(f"{pad}}}")
            else:
                lines.append(f"{pad}{ins.op} {args}".rstrip())

    emit(program.body, 1)
    lines.append(".end")
    return "\n".join(lines) + "\n"


def assemble(text: str) -> Program:
    """Parse assembly text (as :func:`disassemble` writes it) into a verified program."""
    name, params, meta = None, [], {}
    stack: list[list[Instruction]] = [[]]
    loops: list[dict[str, Any]] = []
    ended = False
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("//", 1)[0].strip()
        if not line:
            continue
        where = f"line {n}"
        toks = line.split()
        if toks[0] == ".kernel" and len(toks) == 2:
            name = toks[1]
        elif toks[0] == ".param" and len(toks) == 4:
            params.append(Param(toks[1], toks[2], toks[3]))
        elif toks[0] == ".meta" and len(toks) >= 2:
            try:
                meta = json.loads(line.split(None, 1)[1])
            except ValueError as exc:
                raise InvalidProgram(f"{where}: malformed .meta: {exc}") from None
        elif toks[0] == ".end":
            ended = True
            break
        elif toks[0].startswith("."):
            continue                      # other directives (.version, .target) are the container's
        elif toks[0] == "}":
            if not loops:
                raise InvalidProgram(f"{where}: '}}' without an open loop")
            spec = loops.pop()
            body = tuple(stack.pop())
            try:
                stack[-1].append(Loop(body=body, **spec))
            except TypeError as exc:
                raise InvalidProgram(f"{where}: malformed loop: {exc}") from None
        else:
            op = toks[0]
            opens = toks[-1] == "{"
            if opens:
                toks = toks[:-1]
            if op not in INSTRUCTIONS:
                raise InvalidProgram(f"{where}: unknown instruction {op!r}")
            kwargs: dict[str, Any] = {}     # operands as parsed: the constructor and verify() check them
            for tok in toks[1:]:
                if "=" not in tok:
                    raise InvalidProgram(f"{where}: expected key=value, got {tok!r}")
                k, v = tok.split("=", 1)
                kwargs[k] = _parse(v, where)
            if op == "loop":
                if not opens:
                    raise InvalidProgram(f"{where}: loop must open a block with '{{'")
                loops.append(kwargs)
                stack.append([])
                continue
            for key in ("dst", "src", "a", "b", "cond", "acc", "offsets", "value", "mask", "ptr", "var"):
                if key == "value" and op == "const":
                    continue
                if key in kwargs and kwargs[key] is not None:
                    kwargs[key] = str(kwargs[key])
            try:
                stack[-1].append(INSTRUCTIONS[op](**kwargs))
            except TypeError as exc:
                raise InvalidProgram(f"{where}: malformed {op}: {exc}") from None
    if name is None:
        raise InvalidProgram("assembly has no .kernel directive")
    if loops:
        raise InvalidProgram("assembly ends inside an open loop")
    if not ended:
        raise InvalidProgram("assembly is truncated (no .end)")
    return verify(Program(name, tuple(params), tuple(stack[0]), meta if isinstance(meta, dict) else {}))


def max_tile_elements(program: Program) -> int:
    """Largest tile any register of the program can hold (a static bound)."""
    best, ranges = 1, [1, 1]
    for ins in program.instructions():
        if isinstance(ins, Arange):
            ranges = sorted(ranges + [ins.n])[-2:]
        elif isinstance(ins, (Reshape, Broadcast)):
            best = max(best, math.prod(ins.shape))
    # 2-D tiles are formed by broadcasting two ranges against each other
    return max(best, ranges[0] * ranges[1])
