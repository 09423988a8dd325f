"""Fuzzing every parser and loader a user can feed fornax (``make fuzz``).

Each *target* takes one input drawn by hypothesis (random bytes or text, and mutations of a
valid example: byte flips, truncations, insertions, spliced tokens) and hands it to one
loader.  The property is the same for all: the loader returns, or raises one of the fornax
errors it documents (a one-line message) — never any other exception, never longer than
:data:`LIMIT_S`, never a crash of the interpreter.  Targets:

* ``stack-config``: a stack config TOML file (``fornax.stack.load_config``);
* ``chip-spec``: a chip spec TOML file (``fornax.sim.spec.load_spec``);
* ``chip-partitions``: a chip spec with a ``[partitions]`` table (the same loader);
* ``partition-layout``: a partition layout (``--partition``) against the H100-like chip's
  modes (``fornax.sim.layout.layout``);
* ``vendor-facts``: a family's ``vendor.toml`` (``fornax.vendors.check_facts`` after
  the TOML parse, as ``load_facts`` does);
* ``isa-binary`` / ``isa-assembly``: the tile ISA's encoded and text forms
  (``fornax.sim.isa.decode`` / ``assemble``);
* ``container``: the framed container every binary format uses (``unpack_container``);
* ``<family>-image``: each family's kernel images through its driver's ``decode_image``;
* ``<family>-assembly``: each family's assembly dialect (``Dialect.parse_module``);
* ``compile-cache``: a compile-cache entry (``compile_cache.loads``);
* ``report-json``: a ``fornax.report/1`` document through ``fornax.schemas.validate``;
* ``cli``: argument vectors for ``fornax`` (exit code 0, 1 or 2, never a traceback).

``python -m fornax.fuzz --cases N`` runs N cases per target and prints the count
and the failures per target; it exits 1 when any target failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

from ..stack import BUILTIN_FAMILIES

#: seconds one case may take
LIMIT_S = 5.0
FAMILIES = BUILTIN_FAMILIES


class Hang(Exception):
    """A case ran past :data:`LIMIT_S`."""


@dataclass
class Target:
    name: str
    strategy: Callable[[], SearchStrategy[Any]]   # built lazily (hypothesis is imported then)
    run: Callable[[Any], object]                # the parser under test, on one generated case
    allowed: tuple[type[BaseException], ...]


@dataclass
class Outcome:
    name: str
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


# ---- strategies ------------------------------------------------------------------------------------
class _Draw:
    """``draw`` of a composite strategy under the name ``data.draw`` reads as."""

    def __init__(self, draw):
        self.draw = draw


def _mutations(seed: bytes):
    """Random bytes, and ``seed`` with flips, truncations, insertions and duplicated spans."""
    from hypothesis import strategies as st

    @st.composite
    def mutate(draw):
        data = _Draw(draw)
        b = bytearray(seed)
        for _ in range(data.draw(st.integers(1, 6))):
            kind = data.draw(st.sampled_from(("flip", "cut", "insert", "dup", "zero")))
            pos = data.draw(st.integers(0, max(len(b) - 1, 0)))
            if kind == "flip" and b:
                b[pos] ^= 1 << data.draw(st.integers(0, 7))
            elif kind == "cut":
                b = b[:pos]
            elif kind == "insert":
                b[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
            elif kind == "dup" and b:
                end = data.draw(st.integers(pos, len(b)))
                b[pos:pos] = b[pos:end]
            elif kind == "zero" and b:
                b[pos] = 0
        return bytes(b)
    return st.one_of(st.binary(max_size=512), mutate())


def _text_mutations(seed: str):
    from hypothesis import strategies as st
    lines = seed.splitlines()

    @st.composite
    def splice(draw):
        data = _Draw(draw)
        out = list(lines)
        for _ in range(data.draw(st.integers(1, 4))):
            kind = data.draw(st.sampled_from(("drop", "swap", "edit", "garbage")))
            i = data.draw(st.integers(0, max(len(out) - 1, 0)))
            if not out:
                break
            if kind == "drop":
                out.pop(i)
            elif kind == "swap":
                j = data.draw(st.integers(0, len(out) - 1))
                out[i], out[j] = out[j], out[i]
            elif kind == "edit":
                line = out[i]
                k = data.draw(st.integers(0, len(line)))
                out[i] = line[:k] + data.draw(st.text(max_size=8)) + line[k + 1:]
            else:
                out.insert(i, data.draw(st.text(max_size=40)))
        return "\n".join(out)
    return st.one_of(st.text(max_size=300), splice(),
                     _mutations(seed.encode()).map(lambda b: b.decode("utf-8", "replace")))


# ---- seeds (valid inputs to mutate) ---------------------------------------------------------------
def _seed_program():
    from ..scenarios.workloads import get_workload
    from ..stack import compose, make_config
    stack = compose(make_config("cuda-like", spec="tiny"))
    graph, _ = get_workload("mlp").build(0)
    plan = stack.compiler.compile(graph, stack.target)
    return stack, graph, plan


_SEEDS: dict = {}


def _seeds() -> dict:
    if not _SEEDS:
        from ..layers import compile_cache
        from ..sim import isa
        from ..stack import compose, make_config
        stack, graph, plan = _seed_program()
        program = next(iter(plan.programs.values()))
        _SEEDS["program"] = program
        _SEEDS["isa-binary"] = isa.encode(program)
        _SEEDS["isa-assembly"] = isa.disassemble(program)
        _SEEDS["compile-cache"] = (compile_cache.dumps(plan, graph), graph)
        for family in FAMILIES:
            s = compose(make_config(family, spec="tiny"))
            binary = s.compiler.compile(graph, s.target).binary
            _SEEDS[f"{family}-image"] = (s.driver, binary)
            dialect = _dialect(family)
            if dialect is not None:
                _SEEDS[f"{family}-assembly"] = (dialect, dialect.render_module(
                    [program], _prelude_fields(dialect)))
        from ..compare import execute, prepare
        _SEEDS["report"] = execute(prepare(make_config("cuda-like", spec="tiny"), "graph", None)).report
    return _SEEDS


def _dialect(family: str):
    import importlib
    mod = importlib.import_module(f"fornax.vendors.{family.replace('-', '_')}.compiler")
    return getattr(mod, "DIALECT", None)


def _prelude_fields(dialect) -> dict:
    return {name: "x" for t in dialect.prelude for name in t.fields}


# ---- targets ---------------------------------------------------------------------------------------
def _toml_file(text: str, suffix: str) -> Path:
    tmp = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False, encoding="utf-8", errors="replace")
    with tmp:
        tmp.write(text)
    return Path(tmp.name)


def _load_config(text):
    from ..stack import load_config, make_config
    path = _toml_file(text, ".toml")
    try:
        make_config(base=load_config(path))
    finally:
        path.unlink()


def _load_vendor_facts(text):
    import tomllib

    from ..layers.errors import ConfigError
    from ..vendors import check_facts
    try:
        facts = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"vendor.toml: {exc}") from None
    check_facts(facts, "fuzz/vendor.toml")


def _layout(text):
    from ..sim.layout import layout
    from ..sim.spec import load_spec
    if "h100-like" not in _SEEDS:
        _SEEDS["h100-like"] = load_spec("h100-like")
    layout(_SEEDS["h100-like"], text)


def _load_spec(text):
    from ..sim.spec import load_spec
    path = _toml_file(text, ".toml")
    try:
        load_spec(path)
    finally:
        path.unlink()


def targets() -> list[Target]:
    """Every target (strategies are built when a target runs, so listing them is cheap)."""
    from ..layers import compile_cache
    from ..layers.binary import ContainerError, unpack_container
    from ..layers.errors import ConfigError, FornaxError
    from ..schemas import SchemaError, validate
    from ..sim import isa
    from ..sim.faults import InvalidProgram, SimError, SpecError

    def seed(key):
        return _seeds()[key]

    config_seed = ('[stack]\nvendor = "cuda-like"\nspec = "tiny"\ndevices = 2\ntopology = "ring"\nseed = 3\n'
                   '[stack.seams]\nruntime = "rocm-like"\n')
    from importlib import resources
    spec_seed = (resources.files("fornax.sim") / "specs" / "tiny.toml").read_text(encoding="utf-8")
    facts_seed = (resources.files("fornax.vendors.rocm_like") / "vendor.toml").read_text(encoding="utf-8")
    partitions_seed = (resources.files("fornax.sim") / "specs" / "max1550-like.toml").read_text(encoding="utf-8")
    out = [
        Target("stack-config", lambda: _text_mutations(config_seed), _load_config, (ConfigError, SpecError)),
        Target("chip-spec", lambda: _text_mutations(spec_seed), _load_spec, (SpecError,)),
        Target("chip-partitions", lambda: _text_mutations(partitions_seed), _load_spec, (SpecError,)),
        Target("partition-layout", lambda: _text_mutations("3g.40gb,2g.20gb,1g.10gb:2"), _layout, (SpecError,)),
        Target("vendor-facts", lambda: _text_mutations(facts_seed), _load_vendor_facts, (ConfigError,)),
        Target("isa-binary", lambda: _mutations(seed("isa-binary")), isa.decode, (InvalidProgram,)),
        Target("isa-assembly", lambda: _text_mutations(seed("isa-assembly")), isa.assemble, (InvalidProgram,)),
        Target("container", lambda: _mutations(b"FXCN" + bytes(64)),
               lambda b: unpack_container(b"FXCN", b), (ContainerError,)),
        Target("compile-cache", lambda: _mutations(seed("compile-cache")[0]),
               lambda b: compile_cache.loads(b, seed("compile-cache")[1]), (compile_cache.CorruptEntry,)),
        Target("report-json", lambda: _json_mutations(seed("report")), validate, (SchemaError,)),
        Target("cli", _cli_strategy, _run_cli, ()),
    ]
    def images(family: str) -> Callable[[], SearchStrategy[Any]]:
        return lambda: _image_mutations(seed(f"{family}-image"))

    def assembly(family: str) -> Callable[[], SearchStrategy[Any]]:
        def strategy() -> SearchStrategy[Any]:
            dialect, text = seed(f"{family}-assembly")
            return _text_mutations(text).map(lambda t: (dialect, t))
        return strategy

    for family in FAMILIES:
        out.append(Target(f"{family}-image", images(family),
                          lambda case: case[0].decode_image(case[1]),
                          (ContainerError, InvalidProgram, FornaxError, SimError)))
        if _dialect(family) is not None:
            out.append(Target(f"{family}-assembly", assembly(family),
                              lambda case: case[0].parse_module(case[1]),
                              (ConfigError, InvalidProgram, FornaxError)))
    return out


def _image_mutations(seed_case):
    driver, binary = seed_case
    import dataclasses
    return _mutations(binary.data).map(lambda b: (driver, dataclasses.replace(binary, data=b)))


def _json_mutations(doc: dict):
    from hypothesis import strategies as st
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10))

    @st.composite
    def mutate(draw):
        data = _Draw(draw)
        d = json.loads(json.dumps(doc))
        for _ in range(data.draw(st.integers(1, 3))):
            node, path = d, []
            while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
                key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
                path.append((node, key))
                node = node[key]
            if not path:
                continue
            parent, key = path[-1]
            if data.draw(st.booleans()) and isinstance(parent, dict):
                del parent[key]
            else:
                parent[key] = data.draw(leaves)
        return d
    return st.one_of(mutate(), st.recursive(leaves, lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c), max_leaves=8))


#: words the cli target builds argument vectors from (fast commands and options: a case must
#: end well inside the time limit)
_CLI_WORDS = ("compose", "specs", "workloads", "cost", "gemm", "copy", "compile", "conform", "devices",
              "--vendor", "cuda-like", "rocm-like", "null", "nope", "--seam", "runtime=xpu-like", "driver=",
              "--spec", "tiny", "h100-like", "x.toml", "--devices", "0", "-1", "2", "99999999", "--seed",
              "--workload", "softmax", "--framework", "graph", "tensorflow", "--meta", "--json", "--help",
              "--m", "--n", "--k", "--bytes", "1KiB", "-5", "1e99", "--kind", "d2d", "--emit", "asm",
              "--topology", "mesh", "--level", "L9", "--config", "/", "--dump-ir", "")


def _cli_strategy():
    from hypothesis import strategies as st
    return st.lists(st.one_of(st.sampled_from(_CLI_WORDS), st.text(max_size=6)), max_size=7)


def _run_cli(argv):
    from click.testing import CliRunner

    from ..cli.main import main
    if "compose" in argv and "--spec" not in argv:
        argv = [*argv, "--spec", "tiny"]
    result = CliRunner().invoke(main, list(argv))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    if result.exit_code not in (0, 1, 2):
        raise AssertionError(f"exit code {result.exit_code}")
    if "Traceback" in result.output:
        raise AssertionError("a traceback on the command line")


# ---- running ---------------------------------------------------------------------------------------
def _alarm(signum, frame):
    raise Hang(f"a case ran past {LIMIT_S} s")


def run_target(target: Target, cases: int, seed: int = 0) -> Outcome:
    """``cases`` inputs through ``target``; failures (unexpected exceptions, hangs) recorded
    with the input that caused them (shrunk by hypothesis)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    outcome = Outcome(target.name)
    t0 = time.perf_counter()

    @hseed(seed)
    @settings(max_examples=cases, deadline=None, database=None, derandomize=False,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(target.strategy())
    def check(case):
        outcome.cases += 1
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
        try:
            target.run(case)
        except target.allowed:
            pass
        except Hang as exc:
            outcome.failures.append(f"{exc}: {str(case)[:200]!r}")
        except Exception as exc:      # what the property forbids: recorded, fuzzing goes on
            outcome.failures.append(f"{type(exc).__name__}: {str(exc)[:200]} <- {str(case)[:200]!r}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    check()
    outcome.seconds = time.perf_counter() - t0
    return outcome


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fornax.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="cases per target (default 1000)")
    ap.add_argument("--only", default="", help="comma-separated target names")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table
    chosen = [t for t in targets() if not args.only or t.name in args.only.split(",")]
    table = Table(title=f"fuzzing: {args.cases} cases per target, {LIMIT_S:g} s limit per case")
    for col in ("target", "cases", "failures", "seconds"):
        table.add_column(col, justify="left" if col == "target" else "right")
    outcomes = []
    for t in chosen:
        o = run_target(t, t_cases(t, args.cases), args.seed)
        outcomes.append(o)
        table.add_row(o.name, str(o.cases), str(len(o.failures)), f"{o.seconds:.1f}")
    console = Console()
    console.print(table)
    total = sum(o.cases for o in outcomes)
    console.print(f"{total} cases in total, {sum(len(o.failures) for o in outcomes)} failures")
    for o in outcomes:
        for f in o.failures[:5]:
            console.print(f"[red]{o.name}[/]: {f}", markup=True, highlight=False)
    return 1 if any(o.failures for o in outcomes) else 0


def t_cases(target: Target, cases: int) -> int:
    """The cli target runs a tenth of the cases (each is a whole command)."""
    return max(1, cases // 10) if target.name == "cli" else cases


if __name__ == "__main__":
    sys.exit(main())
