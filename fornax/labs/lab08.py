"""Lab 8: scale-up and scale-out -- from a fabric's topology to the collectives over it.

Experiments: an all-reduce through the library seam's communicator on stacks of four
devices joined by a switch, a full mesh and a ring, with the ring and the tree algorithm
forced and chosen by the library, beside what the analytic model (``fornax cost
allreduce``) predicts; the three families' communicators on one fabric; data- and
tensor-parallel runs of one workload inside one process; and a link that fails in the
middle of an all-reduce.  The code answer is a ``stack.toml`` (data) whose fabric and
algorithm beat a baseline all-reduce, composed and run live by the check.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from ..layers.errors import ConfigError, FornaxError
from .lab import Exercise, Lab, Section, Table, answer, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
TOPOLOGIES = ("switch", "mesh", "ring")
DEVICES = 4
BIG = 4 << 20            # the all-reduce buffer on every rank: 4 MiB of float32
SMALL = 4 << 10          # a latency-bound one: 4 KiB
#: the baseline configuration exercise 8.5 has to beat
BASELINE: dict[str, Any] = {"vendor": "cuda-like", "devices": DEVICES, "topology": "ring", "algorithm": "tree"}
ALGORITHM_CHOICES = ("ring", "tree", "auto")


def _allreduce_on(stack: Any, nbytes: int, algorithm: str | None) -> dict[str, Any]:
    """One all-reduce of ``nbytes`` of float32 over every device of ``stack`` (rank r holds
    r + 1 everywhere): its record, and whether every rank got the sum."""
    import numpy as np
    comm = stack.communicator()
    n, count = comm.size, nbytes // 4
    bufs = []
    for r in range(n):
        ptr = comm.malloc(r, nbytes)
        comm.upload(r, ptr, np.full(count, r + 1, np.float32))
        bufs.append(ptr)
    works = [comm.rank(r).all_reduce(bufs[r], bufs[r], count, "float32", "sum", algorithm=algorithm)
             for r in range(n)]
    for w in works:
        w.wait()
    want = n * (n + 1) / 2
    correct = all(bool(np.all(comm.download(r, bufs[r], count) == want)) for r in range(n))
    rec = comm.records[-1]
    return {"algorithm": rec.algorithm, "reason": rec.reason, "time_s": rec.time_s, "algbw": rec.algbw,
            "busbw": rec.busbw, "call": rec.call, "name": comm.name, "correct": correct,
            "forced_as": comm.facts["algorithms"], "topology": comm.topology.kind if comm.topology else "-",
            "ranks": n}


def _allreduce(vendor: str, devices: int, topology: str, algorithm: str | None, nbytes: int) -> dict[str, Any]:
    from fornax.stack import compose, make_config
    return _allreduce_on(compose(make_config(vendor, devices=devices, topology=topology)), nbytes, algorithm)


def _model_time(devices: int, topology: str, algorithm: str, nbytes: int) -> float:
    """What `fornax cost allreduce` predicts (the topology's alpha-beta model alone)."""
    from fornax.sim.spec import load_spec
    from fornax.sim.topology import Topology
    from fornax.stack import DEFAULT_SPEC
    return Topology.build(load_spec(DEFAULT_SPEC), devices, topology).allreduce_time(nbytes, algorithm)


@lru_cache(maxsize=1)
def _fabrics() -> dict[tuple[str, str, int], dict[str, Any]]:
    """(topology, algorithm or "auto", bytes) -> the live all-reduce on cuda-like, 4 devices."""
    out = {}
    for topo in TOPOLOGIES:
        for algo in ("ring", "tree", "auto"):
            for nb in (SMALL, BIG):
                run = _allreduce("cuda-like", DEVICES, topo, None if algo == "auto" else algo, nb)
                run["model_s"] = _model_time(DEVICES, topo, run["algorithm"], nb)
                out[(topo, algo, nb)] = run
    return out


@lru_cache(maxsize=1)
def _families() -> dict[str, dict[str, Any]]:
    return {v: _allreduce(v, DEVICES, "switch", None, BIG) for v in FAMILIES}


@lru_cache(maxsize=1)
def _parallel() -> dict[str, dict[str, Any]]:
    from fornax.scenarios import parallel
    from fornax.stack import compose, make_config
    out = {}
    for mode in ("dp", "tp"):
        stack = compose(make_config("cuda-like", devices=DEVICES, topology="switch", parallel=mode))
        _, rows, sec = parallel.run(stack, "mlp", mode, 0)
        out[mode] = {"split": sec["split"], "collectives": sec["collectives"], "time_s": sec["time_s"],
                     "single_s": sec["single_device_time_s"], "speedup": sec["speedup"],
                     "ok": all(r["ok"] for r in rows),
                     "comm_s": max(p["communication_s"] for p in sec["per_rank"])}
    return out


@lru_cache(maxsize=1)
def _link_failure() -> dict[str, dict[str, str]]:
    """Per family: the error a link failure in the middle of an all-reduce raises."""
    import numpy as np
    from fornax.sim.faults import FaultPlan, FaultSpec
    from fornax.stack import compose, make_config
    out = {}
    for v in FAMILIES:
        stack = compose(make_config(v, devices=DEVICES, topology="switch"))
        comm = stack.communicator()
        count = (1 << 20) // 4
        bufs = []
        for r in range(DEVICES):
            ptr = comm.malloc(r, count * 4)
            comm.upload(r, ptr, np.ones(count, np.float32))
            bufs.append(ptr)
        stack.devices[1].inject(FaultPlan((FaultSpec("link_failure", at=1, op="peer"),)))
        code, detail = "(none)", "the fault raised no error"
        try:
            works = [comm.rank(r).all_reduce(bufs[r], bufs[r], count) for r in range(DEVICES)]
            for w in works:
                w.wait()
        except FornaxError as exc:
            code = exc.code.name if exc.code is not None else type(exc).__name__
            detail = exc.message.split(": ", 1)[-1].split(" [")[0]
        out[v] = {"code": code, "detail": detail, "communicator": comm.name}
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _us(t: float) -> str:
    return f"{t * 1e6:.2f} µs"


def _gbs(b: float) -> str:
    return f"{b / 1e9:.1f} GB/s"


def experiments(out: Path) -> list[Section]:
    fab, fam, par, fail = _fabrics(), _families(), _parallel(), _link_failure()
    _picture(fab, out / "allreduce.png")
    rows = []
    for (topo, algo, nb), r in fab.items():
        rows.append([topo, algo, _size(nb), r["algorithm"], _us(r["time_s"]), _gbs(r["algbw"]),
                     _gbs(r["busbw"]), _us(r["model_s"]), "yes" if r["correct"] else "NO"])
    fam_rows = [[v, r["name"], r["call"], f"{r['forced_as']['ring']} / {r['forced_as']['tree']}",
                 r["algorithm"], _us(r["time_s"]), _gbs(r["busbw"])] for v, r in fam.items()]
    par_rows = [[mode, ", ".join(f"{c['call']} {c['bytes'] >> 10} KiB ({c['algorithm']})"
                                             for c in p["collectives"]),
                 str(len(p["collectives"])), _us(p["comm_s"]), _us(p["time_s"]), _us(p["single_s"]),
                 f"{p['speedup']:.2f}x", "yes" if p["ok"] else "NO"] for mode, p in par.items()]
    fail_rows = [[v, f["communicator"], f["code"], f["detail"]] for v, f in fail.items()]
    b = BASELINE
    return [
        Section("One all-reduce, three fabrics, two algorithms",
                f"A {DEVICES}-device cuda-like stack (`make_config('cuda-like', devices={DEVICES}, "
                "topology=...)`), one communicator over its devices (`stack.communicator()`, the "
                "library seam's `library.communicator(devices)`), and one float32 sum all-reduce per "
                "row, of 4 KiB (latency-bound) and 4 MiB (bandwidth-bound) on every rank. The "
                "algorithm is forced per call (`all_reduce(..., algorithm='ring'|'tree')`, what the "
                "family's NCCL_ALGO-like switch does) or left to the library (`auto`: "
                "`fornax/layers/collectives/algorithms.py` `choose` prices both on the fabric and "
                "takes the cheaper). Algorithm bandwidth is bytes / time; bus bandwidth is algbw x "
                "2(n-1)/n, what each link really carried, comparable across rank counts. The last "
                "column is the analytic model alone (`fornax cost allreduce --bytes 4MiB --devices 4 "
                "--topology switch --algorithm ring`, `fornax/sim/topology.py`): the live run adds "
                "the reduction kernels and the per-step synchronisation the model leaves out.",
                [Table("all-reduce on cuda-like, 4 devices",
                       ["fabric", "asked", "size", "ran", "time", "algbw", "busbw", "model", "sum ok"],
                       rows)], ["allreduce.png"]),
        Section("Three families, one fabric",
                "The same 4 MiB all-reduce on a 4-device switch through each family's communicator "
                "(the algorithm left to the library). The fabric is the one simulator's, so the times "
                "agree; what differs is the library's face: its call name and how a user forces the "
                "algorithm (`[library.collectives] algorithms` in each vendor.toml).",
                [Table("communicators", ["family", "communicator", "call", "force ring / tree", "ran",
                                         "time", "busbw"], fam_rows)]),
        Section("Data and tensor parallelism inside one process",
                f"`fornax compose --devices {DEVICES} --parallel dp|tp` on the mlp workload "
                "(`fornax/scenarios/parallel.py`): every rank is a device of one stack with its own "
                "stream, and the ranks meet through the communicator. dp splits the batch and "
                "all-gathers the outputs; tp splits the weights (Megatron's column/row split) and "
                "all-reduces the partial outputs. Device time is the slowest rank's, on the simulated "
                "clock; the single-device time is the unsplit workload on one device. This tiny "
                "workload is communication-bound, so neither split pays off. The multi-process "
                "version (one process per rank, started by torchrun, with DDP, FSDP2 and DTensor) "
                "is in docs/distributed.md; it is too slow to run here.",
                [Table("mlp over 4 devices (cuda-like, switch)",
                       ["mode", "collectives", "count", "communication", "device time",
                        "one device", "speedup", "matches float64"], par_rows)]),
        Section("A link fails in the middle of an all-reduce",
                "A deterministic fault plan (`fornax.sim.faults`: `link_failure` on device 1's first "
                "peer transfer) fails one copy of a 1 MiB all-reduce; the communicator reports it "
                "with its family's code when the host waits. (`fornax drill` runs every fault on "
                "every family and front end, with recovery.)",
                [Table("link failure", ["family", "communicator", "error code", "what it says"],
                       fail_rows)]),
        Section("Your turn: beat the baseline",
                f"Exercise 8.5's baseline: {b['vendor']}, {b['devices']} devices on a {b['topology']} "
                f"fabric, the {b['algorithm']} algorithm forced, one {BIG >> 20} MiB float32 "
                f"all-reduce: {_us(fab[(b['topology'], b['algorithm'], BIG)]['time_s'])}. Write a "
                "`stack.toml` (data: the check reads it with `fornax.stack.load_config`, composes "
                "it and runs the same all-reduce live on it; nothing of yours is imported or "
                "executed) with 4 or 8 devices and a fabric, and name the algorithm in answers.toml."),
    ]


def _picture(fab: dict[tuple[str, str, int], dict[str, Any]], path: Path) -> None:
    fig = figure(6, 3.2)
    ax = fig.subplots()
    width = 0.38
    for i, algo in enumerate(("ring", "tree")):
        xs = [t + (i - 0.5) * width for t in range(len(TOPOLOGIES))]
        ax.bar(xs, [fab[(t, algo, BIG)]["busbw"] / 1e9 for t in TOPOLOGIES], width, label=algo,
               color=f"C{i}")
    ax.set_xticks(range(len(TOPOLOGIES)), list(TOPOLOGIES))
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("4 MiB all-reduce over 4 devices (cuda-like)")
    ax.legend()
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    fab, par, fail = _fabrics(), _parallel(), _link_failure()
    b = BASELINE
    base = fab[(b["topology"], b["algorithm"], BIG)]
    return {"small_switch_pick": fab[("switch", "auto", SMALL)]["algorithm"],
            "mesh_ring_busbw_gbs": fab[("mesh", "ring", BIG)]["busbw"] / 1e9,
            "dp_call": par["dp"]["collectives"][0]["call"],
            "cuda_link_code": fail["cuda-like"]["code"],
            "baseline_s": base["time_s"], "baseline_busbw": base["busbw"]}


def _check_faster(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """stack.toml (4 or 8 devices, a fabric) and the algorithm in answers.toml run the 4 MiB
    all-reduce faster than the baseline, live."""
    from fornax.stack import DEFAULT_SPEC, compose, load_config
    base_t, base_bw = facts["baseline_s"], facts["baseline_busbw"]
    want = (f"a 4- or 8-device stack and an algorithm whose {BIG >> 20} MiB all-reduce takes less than "
            f"the baseline's {_us(base_t)} (bus bandwidth {_gbs(base_bw)})")
    path = folder / "stack.toml"
    if not path.is_file():
        return False, want, "no stack.toml"
    algo = str(answer(answers, "8.5")).strip().lower()
    if algo not in ALGORITHM_CHOICES:
        return False, want + "; ex8_5 one of ring, tree, auto", f"ex8_5 = {answer(answers, '8.5')!r}"
    try:
        cfg = load_config(str(path))
    except ConfigError as exc:
        return False, want + " (a valid stack.toml)", exc.message
    setup = f"{cfg.devices} devices, {cfg.topology} fabric, {algo}"
    if isinstance(cfg.devices, bool) or cfg.devices not in (4, 8):
        return False, want, f"devices = {cfg.devices!r}"
    if cfg.spec != DEFAULT_SPEC:
        return False, f"{want}, on the baseline's chip ({DEFAULT_SPEC})", f"spec = {cfg.spec!r}"
    if cfg.meta:
        return False, want + ", with real data (meta = false)", "meta = true"
    try:
        stack = compose(cfg)
        run = _allreduce_on(stack, BIG, None if algo == "auto" else algo)
    except ConfigError as exc:
        return False, want, f"{setup}, which does not compose: {exc.message}"
    except FornaxError as exc:
        return False, want, f"{setup}: the all-reduce failed: {exc.message}"
    got = (f"{setup} ({run['algorithm']} ran): {_us(run['time_s'])}, bus bandwidth {_gbs(run['busbw'])}, "
           f"vs the baseline's {_us(base_t)}, {_gbs(base_bw)}")
    if not run["correct"]:
        return False, want, got + "; but the ranks did not all get the sum"
    return run["time_s"] < base_t, want, got


LAB = Lab(
    number=8, slug="08-scale-out", title="Scale-up and scale-out", part="Part 8",
    goal="Run an all-reduce through the library seam's communicator over switched, fully connected "
         "and ring fabrics, force and compare the ring and tree algorithms, read algorithm and bus "
         "bandwidth against the analytic model, split a workload data- and tensor-parallel inside "
         "one process, and watch a link fail mid-collective.",
    minutes=35, experiments=experiments, facts=facts,
    exercises=[
        Exercise("8.1", f"Which algorithm (ring or tree) does the cuda-like library choose on its own "
                 f"for a {SMALL >> 10} KiB all-reduce over {DEVICES} devices on a switch?",
                 text_fact("8.1", "small_switch_pick"),
                 "fornax/layers/collectives/algorithms.py: choose, and the alpha term in "
                 "fornax/sim/topology.py"),
        Exercise("8.2", f"What bus bandwidth, in GB/s, does the {BIG >> 20} MiB all-reduce forced to "
                 f"ring reach over {DEVICES} devices on a full mesh (cuda-like)?",
                 number_fact("8.2", "mesh_ring_busbw_gbs", rel=0.01),
                 "fornax/sim/topology.py: ring channels on a mesh, and busbw = algbw x 2(n-1)/n "
                 "(fornax/layers/collectives/record.py)"),
        Exercise("8.3", f"In the data-parallel mlp run over {DEVICES} cuda-like devices, which "
                 "collective call brings the ranks' results together (the family's call name)?",
                 text_fact("8.3", "dp_call"), "fornax/scenarios/parallel.py: how dp and tp split mlp"),
        Exercise("8.4", "Which error code does the cuda-like communicator report when a link fails "
                 "during an all-reduce?", text_fact("8.4", "cuda_link_code"),
                 "[library.collectives.errors] in fornax/vendors/cuda_like/vendor.toml"),
        Exercise("8.5", "Write stack.toml (in this folder: [stack] devices = 4 or 8, topology = "
                 "switch, mesh or ring) and give here the algorithm to force (ring, tree or auto) so "
                 f"that one {BIG >> 20} MiB float32 all-reduce over all its devices runs faster than "
                 "the baseline (cuda-like, 4 devices, ring fabric, tree).", _check_faster,
                 "fornax/sim/topology.py: each fabric's links and the ring/tree phases "
                 "(`fornax cost allreduce` prices them)", points=2),
    ],
    starter_files={"stack.toml": "# a stack config: [stack] vendor = ..., devices = 4 or 8, "
                                 "topology = \"switch\" | \"mesh\" | \"ring\"\n"})
