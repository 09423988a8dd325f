"""Readable text forms of the kernel formats: one codec, each family's dialect as data.

Every family prints the device ISA (``fornax.sim.isa``) in its own assembly
dialect: a PTX-like virtual ISA, an AMDGPU-like assembly listing, a
SPIR-V-like disassembly.  The differences are data in the family's
``vendor.toml`` (``[compiler.dialect]``): the module prelude, the comment
marker, the register prefix, a line template per ISA instruction (so
``dot`` reads ``mma.sync.aligned.m16n8k16``, ``v_mfma_f32_32x32x8`` or
``OpDPAS.M8N16K16`` after the family's ``matrix_shape``), the names of the
ISA's functions, reductions and dtypes, and the directives that carry a
kernel's limits (work-group size, registers, shared memory).

:func:`render` and :func:`parse` are exact inverses: ``parse(render(p)) == p``
and the re-encoded program is byte-identical, which is what lets a text form
stand for a binary and back.

A template is a line with ``{field}`` placeholders: the instruction's fields
(``dst``, ``src``, ``fn``, ``dtype``, ...), or a constant of the dialect's
context (``{matrix_m}``, ``{ptx_version}``, any scalar of ``[compiler]``),
which is substituted once when the dialect is built.  ``{{`` and ``}}`` are
literal braces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..sim import isa
from ..sim.faults import InvalidProgram
from .errors import ConfigError

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w+)\}")
#: one operand token: a JSON string, or a run of characters without separators
_TOKEN = r'"(?:[^"\\]|\\.)*"|[^\s,\[\]{}"]+'
_REST = r".+"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_REGISTER = re.compile(r"%r(\d+)\Z")
_NAMED_REGISTER = re.compile(r"%[A-Za-z_]\w*\Z")
_INT = re.compile(r"-?\d+\Z")

#: instruction fields that name registers (``value`` only for stores, ``stop`` when a register)
_REGS = {"dst", "src", "a", "b", "e", "cond", "acc", "offsets", "mask", "var"}
_NAMES = {"ptr", "param", "name", "key"}


def _fn_table(op: str) -> str:
    return "reductions" if op in ("reduce", "store_reduce") else "functions"


def _valid_fns(op: str) -> tuple[str, ...]:
    if op == "unary":
        return tuple(isa.UNARY)
    if op == "binary":
        return tuple(isa.BINARY)
    if op == "reduce":
        return tuple(isa.REDUCE) + tuple(getattr(isa, "ARG_REDUCE", ()))
    return tuple(getattr(isa, "STORE_REDUCE", isa.REDUCE))


class _Template:
    """A line template compiled to a renderer and a matcher."""

    def __init__(self, text: str, context: dict[str, Any], where: str):
        self.text = text
        parts: list[tuple[str, str]] = []          # ("lit", s) | ("field", name)
        pos = 0
        for m in _PLACEHOLDER.finditer(text):
            if m.start() > pos:
                parts.append(("lit", text[pos:m.start()]))
            tok = m.group(0)
            if tok in ("{{", "}}"):
                parts.append(("lit", tok[0]))
            elif m.group(1) in context:
                parts.append(("lit", str(context[m.group(1)])))
            else:
                parts.append(("field", m.group(1)))
            pos = m.end()
        if pos < len(text):
            parts.append(("lit", text[pos:]))
        self.parts = parts
        self.fields = [p for k, p in parts if k == "field"]
        if len(set(self.fields)) != len(self.fields):
            raise ConfigError(f"dialect template {where} = {text!r} names a field twice")
        pattern = ""
        for i, (kind, s) in enumerate(parts):
            if kind == "lit":
                pattern += r"\s+".join(re.escape(w) for w in s.split(" "))
            else:
                rest_of_line = s == "value" and i == len(parts) - 1 and where.startswith("meta")
                pattern += f"(?P<{s}>{_REST if rest_of_line else _TOKEN})"
        self.regex = re.compile(pattern + r"\Z")

    def render(self, values: dict[str, str]) -> str:
        return "".join(s if k == "lit" else values[s] for k, s in self.parts)

    def match(self, line: str) -> dict[str, str] | None:
        m = self.regex.match(line)
        return m.groupdict() if m else None


@dataclass
class Dialect:
    """A family's assembly dialect (built from ``[compiler.dialect]``)."""

    name: str
    comment: str
    register: str
    prelude: list[_Template]
    kernel: _Template
    end_kernel: _Template
    param: _Template
    meta: dict[str, _Template]
    meta_other: _Template
    ops: dict[str, _Template]
    loop_end: _Template
    functions: dict[str, str]
    reductions: dict[str, str]
    types: dict[str, str]
    kinds: dict[str, str]
    axes: list[str]
    none: str
    inverse: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_facts(cls, compiler: dict[str, Any]) -> "Dialect":
        """The dialect of a family's ``[compiler]`` table (its ``dialect`` subtable)."""
        d = compiler.get("dialect")
        if not isinstance(d, dict):
            raise ConfigError(f"compiler {compiler.get('name', '?')!r} has no [compiler.dialect] table")
        m, n, k = compiler.get("matrix_shape", (0, 0, 0))
        reserved = {f.name for cls in isa.INSTRUCTIONS.values() for f in fields(cls)}
        reserved |= {"name", "kind", "dtype", "key", "value", "target"}
        context = {key: v for key, v in compiler.items()
                   if isinstance(v, (str, int, float)) and key not in reserved}
        context.update(matrix_m=m, matrix_n=n, matrix_k=k)
        try:
            def t(text: str, where: str) -> _Template:
                return _Template(str(text), context, where)
            ops = {op: t(d["ops"][op], f"ops.{op}") for op in isa.INSTRUCTIONS}
            meta = {key: t(v, f"meta.{key}") for key, v in d.get("meta", {}).items() if key != "*"}
            dialect = cls(
                name=d["name"], comment=d["comment"], register=d["register"],
                prelude=[t(line, "prelude") for line in d["prelude"]],
                kernel=t(d["kernel"], "kernel"), end_kernel=t(d["end_kernel"], "end_kernel"),
                param=t(d["param"], "param"), meta=meta,
                meta_other=t(d.get("meta", {}).get("*", ".meta {key} {value}"), "meta.*"),
                ops=ops, loop_end=t(d["loop_end"], "loop_end"),
                functions=dict(d.get("functions", {})), reductions=dict(d.get("reductions", {})),
                types=dict(d.get("types", {})), kinds=dict(d.get("kinds", {})),
                axes=list(d.get("axes", [])), none=d.get("none", "_"))
        except KeyError as exc:
            raise ConfigError(f"dialect of compiler {compiler.get('name', '?')!r} lacks {exc}",
                              hint="[compiler.dialect] needs name, comment, register, prelude, kernel, "
                                   "end_kernel, param, loop_end and one ops entry per ISA instruction")
        dialect._check()
        return dialect

    def _check(self) -> None:
        if not self.register or self.register[0].isdigit() or self.register[0] in "-\"":
            raise ConfigError(f"{self.name} dialect: register prefix {self.register!r} must start "
                              "with a non-digit")
        for table in ("functions", "reductions", "types", "kinds"):
            mapping = getattr(self, table)
            inv = {v: key for key, v in mapping.items()}
            if len(inv) != len(mapping):
                raise ConfigError(f"{self.name} dialect: two entries of {table} share one name")
            self.inverse[table] = inv

    # -- value codecs ----------------------------------------------------------------
    def _table(self, table: str) -> dict[str, str]:
        """One of the dialect's name tables (``types``, ``kinds``, ``unary``, ...)."""
        mapping: dict[str, str] = getattr(self, table)
        return mapping

    def _word(self, table: str, value: str) -> str:
        return self._table(table).get(value, value)

    def _unword(self, table: str, token: str, valid: Iterable[str]) -> str:
        value = self.inverse[table].get(token)
        if value is None:
            if token in self._table(table) or token not in valid:
                raise ValueError(f"unknown {table[:-1]} {token!r}")
            value = token
        return value

    def _reg(self, name: str | None) -> str:
        if name is None:
            return self.none
        m = _REGISTER.match(name)
        if m:
            return self.register + m.group(1)             # numbered: the dialect's prefix
        return name if _NAMED_REGISTER.match(name) else json.dumps(name)

    def _unreg(self, tok: str) -> str | None:
        if tok == self.none:
            return None
        if tok.startswith('"'):
            return str(json.loads(tok))
        num = tok[len(self.register):]
        if tok.startswith(self.register) and num.isdigit():
            return f"%r{num}"
        if _NAMED_REGISTER.match(tok):
            return tok
        raise ValueError(f"{tok!r} is not a register")

    @staticmethod
    def _name(name: str) -> str:
        return name if _IDENT.match(name) else json.dumps(name)

    @staticmethod
    def _unname(tok: str) -> str:
        return str(json.loads(tok)) if tok.startswith('"') else tok

    @staticmethod
    def _number(v: bool | int | float) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return repr(v) if isinstance(v, float) else str(int(v))

    @staticmethod
    def _unnumber(tok: str) -> bool | int | float:
        if tok in ("true", "false"):
            return tok == "true"
        if _INT.match(tok):
            return int(tok)
        return float(tok)

    def _dtypes(self) -> tuple[str, ...]:
        return tuple(isa.DTYPES)

    def _render_field(self, op: str, name: str, v: Any) -> str:
        """One instruction field's text (``v``'s type is the field's: register, name, ...)."""
        if name in _REGS or (name == "value" and op in ("store", "store_reduce")):
            return self._reg(v)
        if name == "stop":
            return self._reg(v) if isinstance(v, str) else str(v)
        if name in _NAMES:
            return self._name(v)
        if name == "fn":
            return self._word(_fn_table(op), v)
        if name in ("dtype", "acc_dtype"):
            return self._word("types", v)
        if name == "kind":
            return self._word("kinds", v)
        if name == "shape":
            return "x".join(str(d) for d in v) if v else "scalar"
        if name == "axis" and op == "program_id" and self.axes and 0 <= v < len(self.axes):
            return str(self.axes[v])
        if name in ("value", "other"):
            return self._number(v)
        return str(v)

    def _parse_field(self, op: str, name: str, tok: str) -> Any:
        """Inverse of :meth:`_render_field`: the field's value."""
        if name in _REGS or (name == "value" and op in ("store", "store_reduce")):
            return self._unreg(tok)
        if name == "stop":
            return int(tok) if _INT.match(tok) else self._unreg(tok)
        if name in _NAMES:
            return self._unname(tok)
        if name == "fn":
            return self._unword(_fn_table(op), tok, _valid_fns(op))
        if name in ("dtype", "acc_dtype"):
            return self._unword("types", tok, self._dtypes())
        if name == "kind":
            return self._unword("kinds", tok, ("ptr", "scalar"))
        if name == "shape":
            return () if tok == "scalar" else tuple(int(x) for x in tok.split("x"))
        if name == "axis" and op == "program_id" and self.axes:
            if tok in self.axes:
                return self.axes.index(tok)
            return int(tok)
        if name in ("value", "other"):
            return self._unnumber(tok)
        return int(tok)

    # -- whole programs ----------------------------------------------------------------
    def render_program(self, program: isa.Program) -> list[str]:
        lines = [self.kernel.render({"name": self._name(program.name)})]
        for p in program.params:
            lines.append("  " + self.param.render({"name": self._name(p.name),
                                                   "kind": self._word("kinds", p.kind),
                                                   "dtype": self._word("types", p.dtype)}))
        for key, value in program.meta.items():
            text = json.dumps(value, separators=(",", ":"), allow_nan=True)
            tmpl = self.meta.get(key)
            lines.append("  " + (tmpl.render({"value": text}) if tmpl else
                                 self.meta_other.render({"key": self._name(key), "value": text})))

        def emit(body: Sequence[Any], depth: int) -> None:      # instructions of any ISA op
            pad = "  " * depth
            for ins in body:
                values = {f.name: self._render_field(ins.op, f.name, getattr(ins, f.name))
                          for f in fields(ins) if f.name != "body"}
                lines.append(pad + self.ops[ins.op].render(values))
                if isinstance(ins, isa.Loop):
                    emit(ins.body, depth + 1)
                    lines.append(pad + self.loop_end.render({}))

        emit(program.body, 1)
        lines.append(self.end_kernel.render({}))
        return lines

    def render_module(self, programs: Iterable[isa.Program],
                      module: dict[str, Any] | None = None) -> str:
        """The module text: the prelude (its fields from ``module``), then every kernel."""
        module = module or {}
        try:
            lines = [t.render({k: str(module[k]) for k in t.fields}) for t in self.prelude]
        except KeyError as exc:
            raise ConfigError(f"{self.name} prelude needs the module field {exc}") from None
        for p in programs:
            lines.append("")
            lines.extend(self.render_program(p))
        return "\n".join(lines) + "\n"

    def parse_module(self, text: str, prelude: bool = True) -> tuple[dict[str, str], list[isa.Program]]:
        """Inverse of :meth:`render_module`: the prelude's fields and the verified kernels."""
        expected = self.prelude if prelude else []
        prelude_fields: dict[str, str] = {}
        programs: list[isa.Program] = []
        cur: dict[str, Any] | None = None           # the kernel being read: name, params, meta
        stack: list[list[Any]] = []                  # open instruction bodies (any ISA op)
        loops: list[dict[str, Any]] = []
        seen_prelude = 0
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(self.comment):
                continue
            where = f"{self.name} line {n}"
            if cur is None:
                if seen_prelude < len(expected):
                    got = expected[seen_prelude].match(line)
                    if got is None:
                        raise InvalidProgram(f"{where}: expected {expected[seen_prelude].text!r} "
                                             f"(the module prelude), got {line[:60]!r}")
                    prelude_fields.update(got)
                    seen_prelude += 1
                    continue
                got = self.kernel.match(line)
                if got is None:
                    raise InvalidProgram(f"{where}: expected a kernel, got {line[:60]!r}")
                cur = {"name": self._unname(got["name"]), "params": [], "meta": {}}
                stack = [[]]
                loops = []
                continue
            if loops and self.loop_end.match(line) is not None:
                spec = loops.pop()
                body = tuple(stack.pop())
                stack[-1].append(isa.Loop(body=body, **spec))
                continue
            if self.end_kernel.match(line) is not None:
                if loops:
                    raise InvalidProgram(f"{where}: kernel {cur['name']!r} ends inside an open loop")
                program = isa.Program(cur["name"], tuple(cur["params"]), tuple(stack[0]), cur["meta"])
                programs.append(isa.verify(program))
                cur = None
                continue
            if self._parse_decl(line, cur, where):
                continue
            op, values = self._parse_ins(line, where)
            if op == "loop":
                loops.append(values)
                stack.append([])
            else:
                stack[-1].append(isa.INSTRUCTIONS[op](**values))
        if cur is not None:
            raise InvalidProgram(f"{self.name} text is truncated: kernel {cur['name']!r} has no end")
        if seen_prelude < len(expected):
            raise InvalidProgram(f"{self.name} text lacks its prelude "
                                 f"({expected[seen_prelude].text!r})")
        if not programs:
            raise InvalidProgram(f"{self.name} text defines no kernels")
        return prelude_fields, programs

    def _parse_decl(self, line: str, cur: dict[str, Any], where: str) -> bool:
        got = self.param.match(line)
        if got is not None:
            try:
                cur["params"].append(isa.Param(self._unname(got["name"]),
                                               self._unword("kinds", got["kind"], ("ptr", "scalar")),
                                               self._unword("types", got["dtype"], self._dtypes())))
                return True
            except ValueError as exc:
                raise InvalidProgram(f"{where}: bad parameter: {exc}") from None
        for key, tmpl in self.meta.items():
            got = tmpl.match(line)
            if got is not None:
                cur["meta"][key] = self._json(got["value"], where)
                return True
        got = self.meta_other.match(line)
        if got is not None:
            cur["meta"][self._unname(got["key"])] = self._json(got["value"], where)
            return True
        return False

    @staticmethod
    def _json(text: str, where: str) -> Any:
        try:
            return json.loads(text)
        except ValueError as exc:
            raise InvalidProgram(f"{where}: malformed kernel attribute: {exc}") from None

    def _parse_ins(self, line: str, where: str) -> tuple[str, dict[str, Any]]:
        first_error = None
        for op, tmpl in self.ops.items():
            got = tmpl.match(line)
            if got is None:
                continue
            try:
                return op, {k: self._parse_field(op, k, v) for k, v in got.items()}
            except (ValueError, TypeError) as exc:
                first_error = first_error or f"{exc}"
        detail = f" ({first_error})" if first_error else ""
        raise InvalidProgram(f"{where}: not a {self.name} instruction: {line[:80]!r}{detail}")


def render(program: isa.Program, dialect: Dialect) -> str:
    """One kernel in the dialect (no module prelude)."""
    return "\n".join(dialect.render_program(program)) + "\n"


def parse(text: str, dialect: Dialect) -> isa.Program:
    """Inverse of :func:`render`: exactly one kernel."""
    _, programs = dialect.parse_module(text, prelude=False)
    if len(programs) != 1:
        raise InvalidProgram(f"{dialect.name} text defines {len(programs)} kernels, expected one")
    return programs[0]
