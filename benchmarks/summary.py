"""The figures of a ``bench.json`` as a markdown table, and the README section quoting it.

    python -m benchmarks.summary [bench.json]                 # the figures with a target
    python -m benchmarks.summary bench.json --all             # every figure
    python -m benchmarks.summary bench.json --write-readme    # rewrite README.md's section

The table has a row per figure: its name, its value, its target (``≤`` for a ``max`` target,
``≥`` for a ``min`` one) and whether the run met it.  ``--write-readme [PATH]`` replaces what
lies between the ``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers of PATH (default:
the repository's README.md) with :func:`section`: the table and a line naming the run it
comes from (date, machine, versions), so the figures the README quotes come from a run, never
typed by hand.  The output is deterministic for a given document.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from . import results

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
HEADER = ("| figure | value | target | met |", "|---|---:|---:|:---:|")


def _sig(v: float, digits: int = 3) -> str:
    """``v`` with ``digits`` significant figures, never in exponent notation."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    text = f"{v:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt(value: float, unit: str) -> str:
    """A value in its unit, for people: seconds in s / ms / µs, bytes in GiB / MiB / KiB,
    fractions in percent, ratios as ``1.23x``."""
    if unit == "s":
        for factor, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= factor or name == "µs":
                return f"{_sig(value / factor)} {name}"
    if unit == "us":
        return f"{_sig(value)} µs"
    if unit == "x":
        return f"{_sig(value)}x"
    if unit == "bytes":
        for shift, name in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B")):
            if abs(value) >= 1 << shift or shift == 0:
                return f"{_sig(value / (1 << shift))} {name}"
    if unit == "fraction":
        return f"{_sig(100 * value)} %"
    if unit == "count":
        return f"{value:.0f}"
    if unit == "bool":
        return "yes" if value else "no"
    return f"{_sig(value)} {unit}"


def target_text(fig: dict[str, Any]) -> str:
    if "target" not in fig:
        return "—"
    if fig["unit"] == "bool":
        return fmt(fig["target"], "bool")
    return ("≤ " if fig["kind"] == "max" else "≥ ") + fmt(fig["target"], fig["unit"])


def rows(doc: dict[str, Any], every: bool = False) -> list[dict[str, Any]]:
    """The figures the table shows: those with a target (``every``: all), in the run's order."""
    return [f for f in doc["figures"] if every or "target" in f]


def table(doc: dict[str, Any], every: bool = False) -> str:
    """The markdown table of ``doc``'s figures (those with a target unless ``every``)."""
    lines = list(HEADER)
    for f in rows(doc, every):
        met = "—" if "met" not in f else ("yes" if f["met"] else "no")
        lines.append(f"| `{f['name']}` | {fmt(f['value'], f['unit'])} | {target_text(f)} | {met} |")
    return "\n".join(lines)


def provenance(doc: dict[str, Any]) -> str:
    """One line naming the run: command, date, machine and versions; what did not run."""
    m = doc["meta"]
    v = m["versions"]
    versions = ", ".join(f"{d} {v[d]}" for d in ("fornax", "torch", "jax", "numpy", "transformers") if v.get(d))
    cpus = m["cpu_count"]
    took = f", {m['wall_s'] / 60:.0f} min" if "wall_s" in m else ""
    if m.get("load_average"):
        took += f", load average {m['load_average'][0]:g} at the end"
    command = m.get("command", "python -m benchmarks")
    words = command.split()
    source = words[words.index("--json") + 1] if "--json" in words[:-1] else "bench.json"
    cpu = f" {m['cpu']}" if m.get("cpu") else ""
    line = (f"Figures from one run of `{command}` on a {cpus}-core{cpu} machine "
            f"({m['date'][:10]}{took}; Python {m['python']}, {versions}), rendered by "
            f"`python -m benchmarks.summary {source} --write-readme`.")
    targets = [f for f in doc["figures"] if "target" in f]
    line += f" {sum(f['met'] for f in targets)} of {len(targets)} targets met."
    skipped = [f"{s['module']} ({s['reason']})" for s in m.get("skipped", [])]
    failed = [f"{e['module']} ({e['error'].split(':')[0]})" for e in m.get("errors", [])]
    if skipped:
        line += " Not run: " + "; ".join(skipped) + "."
    if failed:
        line += " Failed: " + ", ".join(failed) + "."
    return line


def section(doc: dict[str, Any], every: bool = False) -> str:
    """The README section, markers included."""
    return "\n".join([BEGIN, "", provenance(doc), "", table(doc, every), "", END])


def write_readme(doc: dict[str, Any], path: Path = README, every: bool = False) -> None:
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} section to rewrite")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    path.write_text(text[:start] + section(doc, every) + text[end:], encoding="utf-8")


def readme_rows(text: str) -> list[dict[str, str]]:
    """The table rows of the README section (figure, value, target, met), as written."""
    body = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    out = []
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out.append(dict(zip(("figure", "value", "target", "met"), [cells[0].strip("`"), *cells[1:]])))
    return out


def load(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    results.validate(doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.summary", description=__doc__.splitlines()[0])
    p.add_argument("path", nargs="?", help=f"the bench.json (default: ${results.JSON_ENV} or "
                                           f"./{results.DEFAULT_JSON})")
    p.add_argument("--all", action="store_true", help="every figure, not only those with a target")
    p.add_argument("--write-readme", nargs="?", const=str(README), default=None, metavar="README",
                   help="rewrite the section between the bench markers of README (default: the repository's)")
    args = p.parse_args(argv)
    doc = load(results.json_path(args.path))
    if args.write_readme:
        write_readme(doc, Path(args.write_readme), args.all)
        print(f"{args.write_readme}: benchmark section rewritten ({len(rows(doc, args.all))} figures)")
    else:
        print(table(doc, args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())
