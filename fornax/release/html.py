"""A baseline check as one self-contained HTML page: inline CSS, no scripts, no external
resources, so the page can be archived as a CI artefact and opened anywhere.

The page has the summary (baseline, when saved and checked, the counts, the software
differences) and one table row per compared metric, with the verdict as the row's class
(``regression`` rows are highlighted) and in its last cells.  The regression count is also
in an element with id ``regressions`` and in the page title.
"""

from __future__ import annotations

from html import escape
from typing import Any

from .metrics import fmt_row_value as _value

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.regression { background: #fdd; font-weight: bold; }
tr.improvement { background: #dfd; }
tr.within { background: #ffd; }
tr.same { color: #777; }
.verdict-regression { color: #b00; }
.bad { color: #b00; font-weight: bold; }
.good { color: #070; font-weight: bold; }
"""


def render(doc: dict[str, Any]) -> str:
    """The ``fornax.regression/1`` document ``doc`` as an HTML page."""
    c = doc["counts"]
    n = doc["regressions"]
    verdict = (f'<span class="bad">{n} regression{"s" if n != 1 else ""}</span>' if n
               else '<span class="good">no regressions</span>')
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>fornax baseline {escape(doc['baseline'])}: {n} regressions</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>fornax baseline check — {escape(doc['baseline'])}</h1>",
           f'<p id="verdict">{verdict}</p>',
           '<table id="summary"><tbody>']
    summary = [("baseline saved", doc["created"]), ("checked", doc["checked"]),
               ("runs", str(doc["runs"])), ("metrics compared", str(len(doc["rows"])))]
    out += [f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary]
    out.append(f'<tr><th>regressions</th><td id="regressions" class="num">{c["regression"]}</td></tr>')
    for key in ("improvement", "within", "new", "same"):
        out.append(f'<tr><th>{key}</th><td id="{key}" class="num">{c[key]}</td></tr>')
    out.append("</tbody></table>")
    diffs = doc["software"]["differences"]
    out.append("<h2>Software</h2>")
    if diffs:
        out.append('<table id="software"><thead><tr><th>package</th><th>baseline</th><th>now</th>'
                   "</tr></thead><tbody>")
        out += [f"<tr><td>{escape(d['key'])}</td><td>{escape(str(d['baseline']))}</td>"
                f"<td>{escape(str(d['now']))}</td></tr>" for d in diffs]
        out.append("</tbody></table><p>A software difference is shown, not a regression by itself.</p>")
    else:
        out.append("<p>The same fornax, Python, numpy, torch, jax and jaxlib versions as the baseline.</p>")
    out.append("<h2>Metrics</h2>")
    out.append('<table id="metrics"><thead><tr><th>run</th><th>metric</th><th>baseline</th>'
               "<th>now</th><th>change</th><th>better</th><th>verdict</th><th>why</th></tr></thead><tbody>")
    order = {"regression": 0, "improvement": 1, "within": 2, "new": 3, "same": 4}
    for r in sorted(doc["rows"], key=lambda r: order[r["verdict"]]):
        change = "—" if r["change"] is None else f"{r['change']:+.2%}"
        out.append(f'<tr class="{r["verdict"]}"><td>{escape(r["run"])}</td><td>{escape(r["label"])}</td>'
                   f'<td class="num">{escape(_value(r, "baseline"))}</td>'
                   f'<td class="num">{escape(_value(r, "now"))}</td><td class="num">{change}</td>'
                   f'<td>{r["better"]}</td><td class="verdict-{r["verdict"]}">{r["verdict"]}</td>'
                   f"<td>{escape(r['why'])}</td></tr>")
    out.append("</tbody></table></body></html>")
    return "\n".join(out) + "\n"
