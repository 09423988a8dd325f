"""Lab 3's virtualization experiment: one chip split into partitions, each family on its own
kind of chip (MIG-like instances, MI300X-like compute partitions, Max-1550-like stacks as
devices).

Per partition: its units, memory and copy engines, and what one GEMM costs on it against the
whole chip (shape-only stacks: the cost model prices the kernel, no data moves).  Per family:
what a contained and an uncontained uncorrectable ECC error and a hang on partition 0 do to
partition 1, as ``fornax drill --partition`` runs them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .lab import Section, Table

#: (family, its chip, the layout the lab splits it into)
CHIPS = (("cuda-like", "h100-like", "3g.40gb,4g.40gb"), ("rocm-like", "mi300x-like", "qpx"),
         ("xpu-like", "max1550-like", "flat"))
GEMM = 4096                                    # m = n = k of the bfloat16 GEMM each partition runs
#: the drill faults of the lab: (drill fault, how the table names it)
FAULTS = (("ecc_uncorrectable", "contained ECC error"), ("ecc_uncontained", "uncontained ECC error"),
          ("hang", "hang (watchdog)"))


def _gemm_s(stack: Any, index: int) -> float:
    """Simulated seconds of one GEMM x GEMM x GEMM bfloat16 library GEMM on device ``index``."""
    rt, dev = stack.runtime, stack.devices[index]
    rt.set_device(index)
    a, b, c = (rt.malloc(GEMM * GEMM * 2) for _ in range(3))
    first = len(dev.timeline.records)
    stack.library.gemm(a, b, c, {"m": GEMM, "n": GEMM, "k": GEMM, "dtype": "bfloat16"})
    rt.synchronize()
    return sum(r.end - r.start for r in dev.timeline.records[first:])


@lru_cache(maxsize=1)
def partitions() -> tuple[tuple[str, str, str, str, int, float, int, float, float], ...]:
    """Per family and partition: chip, layout, the partition's label, its units, memory (GB),
    copy engines, the GEMM's simulated seconds on it and on the whole chip."""
    from fornax.stack import compose, make_config
    rows = []
    for fam, chip, text in CHIPS:
        whole = _gemm_s(compose(make_config(fam, spec=chip, meta=True)), 0)
        stack = compose(make_config(fam, spec=chip, meta=True, partition=text))
        assert stack.layout is not None
        for part in stack.layout.partitions:
            props = stack.driver.properties(part.index)
            rows.append((fam, chip, stack.layout.text, part.label, props.compute_units,
                         props.memory_bytes / 1e9, part.spec.copy_engines, _gemm_s(stack, part.index), whole))
    return tuple(rows)


@lru_cache(maxsize=1)
def faults() -> tuple[tuple[str, str, str, str, str, str, bool], ...]:
    """Per family and fault on partition 0: where it lands (scope), the family's code, what
    partition 1 saw, the recovery, and whether the drill row held."""
    from fornax.scenarios.drill import drill_row
    rows = []
    for fam, chip, text in CHIPS:
        for fault, name in FAULTS:
            row = drill_row(fault, fam, "graph", spec=chip, partition=text)
            part = row.partition or {}
            rows.append((fam, name, str(part.get("scope", "?")), str(row.code),
                         str(part.get("neighbour", "?")), row.recovery, row.ok))
    return tuple(rows)


def section() -> Section:
    parts, hits = partitions(), faults()
    count = {fam: sum(1 for p in parts if p[0] == fam) for fam, _, _ in CHIPS}
    return Section(
        "Virtualization: one chip, several tenants",
        f"Each family on its own kind of chip, split into partitions: the H100-like chip into "
        f"{count['cuda-like']} MIG-like GPU instances, the MI300X-like chip in QPX mode "
        f"({count['rocm-like']} compute partitions), the Max-1550-like card FLAT (each of its "
        f"{count['xpu-like']} stacks a device). The driver enumerates the partitions as "
        f"devices, and each has its share of the chip's units, memory, bandwidth, L2 and copy "
        f"engines (fornax/sim/layout.py), so one {GEMM}x{GEMM}x{GEMM} bfloat16 GEMM from the "
        f"family's library costs more on a partition than on the whole chip (shape-only stacks, "
        f"`meta = true`: the cost model prices the kernel the library picks; the placement "
        f"normalises a MIG layout largest first). The partitions share the chip: each mode's "
        f"fault table (the chip spec's `[partitions]`) says whether a fault stays in its "
        f"partition or takes the chip down. `fornax drill --partition` injects the fault on "
        f"partition 0 while a second tenant runs on partition 1. An uncorrectable ECC error the "
        f"hardware contained stays in its partition on {_who(hits, 0, 'partition')} and takes "
        f"the whole chip down on {_who(hits, 0, 'device')}; one it could not contain "
        f"{_where(hits, 1)}; a hang {_where(hits, 2)}. "
        f"{sum(r[-1] for r in hits)} of {len(hits)} drill rows held: the fault was detected with the "
        f"family's code, the neighbour ran on or went down as the mode says, and both ran again with "
        f"identical results after recovery.",
        [Table(f"the partitions, and one {GEMM}^3 bfloat16 GEMM on each",
               ["family", "chip", "layout", "partition", "units", "memory", "copy engines",
                "GEMM (µs)", "vs whole chip"],
               [[fam, chip, text, label, str(units), f"{mem:.1f} GB", str(ce), f"{t * 1e6:.1f}",
                 f"{t / whole:.2f}x of {whole * 1e6:.1f} µs"]
                for fam, chip, text, label, units, mem, ce, t, whole in parts]),
         Table("a fault on partition 0, seen from partition 1",
               ["family", "fault", "lands on", "partition 0 raises", "partition 1", "recovery", "drill"],
               [[fam, name, scope, code, nb, rec, "ok" if ok else "FAILED"]
                for fam, name, scope, code, nb, rec, ok in hits])])


def _who(hits: Any, fault: int, scope: str) -> str:
    """The families whose chip puts fault number ``fault`` of :data:`FAULTS` on ``scope``."""
    found = [fam for fam, name, where, *_ in hits if name == FAULTS[fault][1] and where == scope]
    if not found:
        return "no family's chip"
    return found[0] if len(found) == 1 else ", ".join(found[:-1]) + " and " + found[-1]


#: what a fault's scope does, in words
SCOPE = {"partition": "stays in its partition", "device": "takes the whole chip down"}


def _where(hits: Any, fault: int) -> str:
    """What fault number ``fault`` does: the same on every chip, or per family."""
    scopes = {fam: where for fam, name, where, *_ in hits if name == FAULTS[fault][1]}
    if len(set(scopes.values())) == 1:
        return f"{SCOPE[next(iter(scopes.values()))]} on every chip"
    return "; ".join(f"{SCOPE[where]} on {fam}" for fam, where in scopes.items())


def facts() -> dict[str, Any]:
    """The family whose chip keeps a contained ECC error in its partition, and how many other
    partitions an uncontained one takes down on the MIG-like chip."""
    hits = faults()
    kept = [fam for fam, name, scope, *_ in hits if name == FAULTS[0][1] and scope == "partition"]
    mig = next(nb for fam, name, _, _, nb, _, _ in hits if fam == "cuda-like" and name == FAULTS[1][1])
    return {"contained_ecc_family": ", ".join(kept), "mig_uncontained_neighbour": mig.split(" ", 1)[0]}
