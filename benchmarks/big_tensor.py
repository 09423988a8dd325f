"""A 1 GiB float32 tensor created on the device and summed, on every family.

Two ways a user creates it (``variant``):

* ``factory``: ``torch.ones(2**28, device="fornax").sum()`` (a fill kernel writes it);
* ``copy``: ``torch.ones(2**28).to("fornax").sum()`` (a host tensor copied to the device).

Each measurement runs in a fresh Python process (``python -c``): it composes the family's
stack (``fornax.frameworks.torch.use_stack``), warms it with a 16-element tensor made and
summed both ways (imports and first calls), makes the host tensor (``copy`` only), then
times creating the device tensor through ``.sum()``, ``torch.fornax.synchronize()`` and
``.item()`` (the sum must come out as the element count).

Host memory is the peak resident set during that span minus the resident set right before
it, so for ``copy`` the host tensor's own 1 GiB is not counted: what is judged is what the
transfer, the simulated HBM and the sum add on top of it.  On Linux the peak is ``VmHWM``
of ``/proc/self/status``, reset right before the span (``/proc/self/clear_refs``), and the
baseline is ``VmRSS``; elsewhere both are ``ru_maxrss`` (a peak that only grows).

Targets: at most :data:`TARGET_S` seconds and :data:`RSS_TARGET_BYTES` of host memory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fornax.stack import BUILTIN_FAMILIES

TARGET_S = 2.0
RSS_TARGET_BYTES = int(1.5 * 2**30)
#: float32 elements of the tensor (1 GiB)
ELEMENTS = 2**28
VARIANTS = ("factory", "copy")

_ROOT = Path(__file__).resolve().parents[1]

#: the measurement, run by a fresh interpreter: argv = vendor, variant, elements; prints one JSON line
_CHILD = r'''
import json, resource, sys, time

vendor, variant, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


def status(key):
    """A line of /proc/self/status in bytes, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def maxrss():
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status("VmHWM") is not None
    except OSError:
        return False


import torch
import fornax.frameworks.torch as ft

ft.use_stack(vendor)
for _ in range(2):
    torch.ones(16, device="fornax").sum().item()
    torch.ones(16).to("fornax").sum().item()
torch.fornax.synchronize()
host = torch.ones(n, dtype=torch.float32) if variant == "copy" else None

exact = reset_peak()
before = status("VmRSS") if exact else maxrss()
t0 = time.perf_counter()
if variant == "factory":
    t = torch.ones(n, dtype=torch.float32, device="fornax")
else:
    t = host.to("fornax")
total = t.sum()
torch.fornax.synchronize()
value = total.item()
seconds = time.perf_counter() - t0
peak = status("VmHWM") if exact else maxrss()
print(json.dumps({"seconds": seconds, "rss_growth_bytes": max(0, peak - before), "value": value,
                  "peak_reset": exact}))
'''


def measure(vendor: str, variant: str = "factory", elements: int = ELEMENTS) -> dict:
    """Time and host memory of creating and summing ``elements`` float32 ones on ``vendor``'s
    stack the ``variant`` way, in a fresh process: a dict of ``vendor``, ``variant``,
    ``seconds``, ``rss_growth_bytes``, ``tensor_bytes`` (and ``sum_ok``: whether the sum
    came out as the element count)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
    done = subprocess.run([sys.executable, "-c", _CHILD, vendor, variant, str(int(elements))],
                          cwd=_ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"big-tensor measurement ({vendor}, {variant}) failed:\n{done.stderr[-4000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {"vendor": vendor, "variant": variant, "seconds": got["seconds"],
            "rss_growth_bytes": int(got["rss_growth_bytes"]), "tensor_bytes": int(elements) * 4,
            "sum_ok": got["value"] == float(elements)}


def measure_all(vendor: str, elements: int = ELEMENTS) -> list[dict]:
    """:func:`measure` for every variant."""
    return [measure(vendor, variant, elements) for variant in VARIANTS]


def main(vendors=BUILTIN_FAMILIES, elements: int = ELEMENTS) -> list[dict]:
    table = Table(title=f"{elements * 4 / 2**30:g} GiB float32 tensor created on the device and summed, "
                        f"each in a fresh process; targets: ≤ {TARGET_S:g} s, ≤ "
                        f"{RSS_TARGET_BYTES / 2**30:g} GiB host RSS growth (copy: beyond the host tensor)")
    for col in ("family", "variant", "wall", f"≤ {TARGET_S:g} s", "RSS growth",
                f"≤ {RSS_TARGET_BYTES / 2**30:g} GiB", "sum"):
        table.add_column(col, justify="left" if col in ("family", "variant") else "right")
    rows = []
    for vendor in vendors:
        for row in measure_all(vendor, elements):
            time_ok = row["seconds"] <= TARGET_S
            rss_ok = row["rss_growth_bytes"] <= RSS_TARGET_BYTES
            table.add_row(vendor, row["variant"], f"{row['seconds']:.2f} s", "yes" if time_ok else "NO",
                          f"{row['rss_growth_bytes'] / 2**30:.2f} GiB", "yes" if rss_ok else "NO",
                          "ok" if row["sum_ok"] else "WRONG")
            rows.append({**row, "seconds_met": time_ok, "rss_met": rss_ok})
    Console().print(table)
    return rows


if __name__ == "__main__":
    main()
