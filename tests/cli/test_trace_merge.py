"""``fornax trace merge``: the ranks' traces of a distributed run as one Perfetto trace
(:mod:`fornax.sim.trace_merge`), built here from real device timelines, one per rank, with
collectives carrying the args the torch.distributed backend gives them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import Counter

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.schemas import validate
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.sim.timeline import Packet, Semaphore
from fornax.sim.trace import chrome_trace
from fornax.sim.trace_merge import TraceMergeError, merge, summary

US = 1e-6
ENGINE = "peer-collectives"
FWD_US = [100, 250, 180]        # each rank's forward kernel: rank 1 arrives last at seq 1
BWD_US = 30                     # the backward kernel, overlapping the collective
COST_US = [50, 40]              # the collectives' transfer times


def approx(x):
    return pytest.approx(x, rel=1e-9, abs=1e-15)


def rank_trace(rank: int, world: int = 3, fwd_us=FWD_US, *, family: str = "cuda-like", node: int = 0,
               extra: tuple = (), copies: int = 0, side: tuple[float, float] | None = None) -> dict:
    """Rank ``rank``'s trace, as a torchrun rank writes it: its device's timeline, with
    ``fwd`` on the compute engine, then an all-reduce (seq 1) that waits for it and starts at
    the latest rank's arrival, ``bwd`` overlapping it, a second all-reduce (seq 2) all ranks
    reach together; ``extra``: further (call, group, seq, cost_us[, latest_us]) collectives on
    this rank; ``copies``: copies of 20 µs at time 0 (they spread over the copy engines);
    ``side``: a kernel (start_us, dur_us) on another queue."""
    dev = Device(load_spec("tiny"), index=0)
    tl = dev.timeline
    tl.add_engine(ENGINE)
    main_q, comm, copy_q = tl.create_queue("main"), tl.create_queue("comm"), tl.create_queue("copy")
    ready = Semaphore("fwd done")

    def collective(call: str, group: str, seq: int, cost_us: float, latest: float | None = None):
        def work() -> float:
            now = tl.now
            start = now if latest is None else latest
            tl.annotate(collective=call, seq=seq, bytes=4096 * seq, algorithm="ring", group=group,
                        arrived_s=now, latest_s=start, waited_s=start - now, last_rank=rank)
            return start - now + cost_us * US
        return work

    for i in range(copies):
        q = copy_q if i == 0 else tl.create_queue(f"copy{i}")
        q.submit(Packet("copy", lambda: 20 * US, f"h2d {i}", "copy"))
    main_q.submit(Packet("compute", lambda: fwd_us[rank] * US, "fwd", "kernel", signals=[(ready, 1)]))
    comm.submit(Packet(ENGINE, collective("ncclAllReduce", "0", 1, COST_US[0], max(fwd_us) * US),
                       "ncclAllReduce seq 1", "collective", waits=[(ready, 1)]))
    main_q.submit(Packet("compute", lambda: BWD_US * US, "bwd", "kernel"))
    comm.submit(Packet(ENGINE, collective("ncclAllReduce", "0", 2, COST_US[1]), "ncclAllReduce seq 2",
                       "collective"))
    for call, group, seq, cost_us, *latest_us in extra:
        latest = latest_us[0] * US if latest_us else None
        comm.submit(Packet(ENGINE, collective(call, group, seq, cost_us, latest), f"{call} seq {seq}",
                           "collective"))
    if side is not None:                # a delay on an engine of its own, then the kernel
        tl.add_engine("peer-delay")
        q, gate = tl.create_queue("side"), Semaphore("side gate")
        q.submit(Packet("peer-delay", lambda: side[0] * US, "delay", "wait", signals=[(gate, 1)]))
        q.submit(Packet("compute", lambda: side[1] * US, "side", "kernel", waits=[(gate, 1)]))
    tl.drain()
    doc = chrome_trace([dev])
    doc["otherData"].update(rank=rank, world_size=world, family=family, node=node, backend="fornax")
    return json.loads(json.dumps(doc))          # as read back from the rank's file


@pytest.fixture(scope="module")
def traces() -> list[dict]:
    return [rank_trace(r, copies=2 if r == 0 else 0) for r in range(3)]


@pytest.fixture
def fresh(traces) -> list[dict]:
    return copy.deepcopy(traces)


def engine_tid(doc: dict, pid: int) -> int:
    return next(e["tid"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
                and e["pid"] == pid and e["args"]["name"] == f"engine {ENGINE}")


# ---- the merged trace ----------------------------------------------------------------------------
def test_one_process_per_rank_every_event_kept_with_its_track(traces):
    doc = merge(traces)
    evs = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r + 1: f"rank {r} · cuda-like · node 0 · device 0 (tiny)" for r in range(3)}
    order = {e["pid"]: e["args"]["sort_index"] for e in evs if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert order == {1: 0, 2: 1, 3: 2}
    for r, t in enumerate(traces):
        kept = [e for e in t["traceEvents"]
                if not (e["ph"] == "M" and e["name"] in ("process_name", "process_sort_index"))]
        mine = [e for e in evs if e["pid"] == r + 1 and e["ph"] not in "sf" and e.get("cat") != "straggler"
                and not (e["ph"] == "M" and e["name"] in ("process_name", "process_sort_index"))]
        assert mine == [{**e, "pid": r + 1} for e in kept]          # same events, same tids, re-pid'd
    other = doc["otherData"]
    assert other["ranks"] == [0, 1, 2] and other["world_size"] == 3 and other["family"] == "cuda-like"
    assert other["backend"] == "fornax" and other["nodes"] == {"0": 0, "1": 0, "2": 0}
    assert other["summary"] == summary(traces)
    json.dumps(doc)


def test_flows_join_each_collective_from_the_last_rank_inside_its_slices(traces):
    doc = merge(traces)
    evs = doc["traceEvents"]
    flows: dict[int, dict[str, dict]] = {}
    for e in evs:
        if e["ph"] in "sf":
            assert e["bp"] == "e" and e["cat"] == "collective"
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert len(flows) == 4 and all(set(f) == {"s", "f"} for f in flows.values())
    pairs = Counter()
    for f in flows.values():
        s, t = f["s"], f["f"]
        assert s["name"] == t["name"] == "ncclAllReduce" and s["args"] == t["args"]
        pairs[(s["args"]["seq"], s["pid"] - 1, t["pid"] - 1)] += 1
        for end in (s, t):       # each end lies in its rank's slice of that collective
            (slice_,) = [e for e in evs if e["ph"] == "X" and e["pid"] == end["pid"] and e["tid"] == end["tid"]
                         and e["ts"] <= end["ts"] <= e["ts"] + e["dur"]]
            assert slice_["cat"] == "collective" and slice_["args"]["seq"] == end["args"]["seq"]
            assert end["tid"] == engine_tid(doc, end["pid"])
    # seq 1: rank 1 came last and releases ranks 0 and 2; seq 2: all together, drawn from rank 0
    assert pairs == {(1, 1, 0): 1, (1, 1, 2): 1, (2, 0, 1): 1, (2, 0, 2): 1}


def test_the_rank_that_arrived_last_gets_a_straggler_instant(traces):
    doc = merge(traces)
    (inst,) = [e for e in doc["traceEvents"] if e.get("cat") == "straggler"]
    assert inst["ph"] == "i" and inst["s"] == "t" and inst["pid"] == 2
    assert inst["tid"] == engine_tid(doc, 2) and inst["ts"] == approx(250)
    a = inst["args"]
    assert (a["seq"], a["call"], a["group"], a["rank"]) == (1, "ncclAllReduce", "0", 1)
    assert a["waited_s"] == {"0": approx(150 * US), "2": approx(70 * US)}
    assert a["max_wait_s"] == approx(150 * US) and a["total_wait_s"] == approx(220 * US)


def test_summary_per_rank_matches_the_timelines_built(traces):
    s = summary(traces)
    validate(s)
    assert s["world_size"] == 3 and s["family"] == "cuda-like" and s["warnings"] == []
    assert s["unmatched"] == [] and s["mismatched"] == []
    end = max(FWD_US) + sum(COST_US)                                         # 340 µs on every rank
    for row, fwd in zip(s["ranks"], FWD_US):
        comm = end - fwd                       # the collectives span from the arrival to the end
        assert row["kernels"] == 2 and row["compute_s"] == approx((fwd + BWD_US) * US)
        assert row["collectives"] == 2 and row["collective_s"] == approx(comm * US)
        assert row["waiting_s"] == approx((max(FWD_US) - fwd) * US)
        assert row["exposed_s"] == approx((comm - BWD_US) * US)          # bwd hides 30 µs of it
        assert row["overlap"] == approx(BWD_US / comm)
        assert row["end_s"] == approx(end * US) and row["point_to_point"] == 0
        assert row["device"] == "device 0 (tiny)" and row["node"] == 0
    r0, r1, r2 = s["ranks"]
    assert (r0["copies"], r0["copy_s"]) == (2, approx(20 * US))       # two engines at once: 20 µs busy
    assert (r1["copies"], r1["copy_s"]) == (0, 0)
    assert [r["straggler"] for r in s["ranks"]] == [0, 1, 0]
    assert r1["caused_wait_s"] == approx(220 * US) and r0["caused_wait_s"] == 0
    assert s["stragglers"] == [{"rank": 1, "count": 1, "caused_wait_s": approx(220 * US)}]


def test_summary_per_collective(traces):
    c1, c2 = summary(traces)["collectives"]
    assert c1 == {"group": "0", "seq": 1, "call": "ncclAllReduce", "bytes": 4096, "algorithm": "ring",
                  "ranks": [0, 1, 2], "start_s": approx(250 * US), "arrival_skew_s": approx(150 * US),
                  "last_rank": 1, "total_wait_s": approx(220 * US), "failed_ranks": []}
    assert (c2["seq"], c2["bytes"], c2["last_rank"], c2["ranks"]) == (2, 8192, None, [0, 1, 2])
    assert c2["arrival_skew_s"] < 1e-12 and c2["total_wait_s"] == 0


def test_exposed_communication_and_waits_add_up_over_collectives():
    """Rank 0 waits 200 µs at seq 1 and 10 µs at seq 3; bwd [100, 130] and a kernel at
    [200, 220] overlap its collectives [100, 410], with a gap between them."""
    seq3 = ("ncclAllReduce", "0", 3, 10, 400)
    traces = [rank_trace(0, 2, [100, 300], extra=(seq3,), side=(200, 20)),
              rank_trace(1, 2, [100, 300], extra=(seq3,))]
    r0, r1 = summary(traces)["ranks"]
    assert r0["kernels"] == 3 and r0["compute_s"] == approx(150 * US)
    assert r0["collectives"] == 3 and r0["collective_s"] == approx(310 * US)
    assert r0["waiting_s"] == approx(210 * US)
    assert r0["exposed_s"] == approx(260 * US) and r0["overlap"] == approx(50 / 310)
    assert r1["waiting_s"] == approx(10 * US) and r1["exposed_s"] == approx((110 - 30) * US)


def test_collectives_some_ranks_never_issued_are_reported_not_fatal(tmp_path):
    late = ("ncclAllGather", "0", 3, 10)
    sub = ("ncclBroadcast", "tp", 1, 5)         # a group of ranks 0 and 2 only: matched, not missing
    traces = [rank_trace(0, extra=(late, sub)), rank_trace(1), rank_trace(2, extra=(late, sub))]
    s = summary(traces)
    assert s["unmatched"] == [{"group": "0", "seq": 3, "call": "ncclAllGather", "ranks": [0, 2],
                               "missing_ranks": [1]}]
    assert [(c["group"], c["seq"], c["ranks"]) for c in s["collectives"]] == \
        [("0", 1, [0, 1, 2]), ("0", 2, [0, 1, 2]), ("0", 3, [0, 2]), ("tp", 1, [0, 2])]
    res = CliRunner().invoke(main, ["trace", "merge", *_write(traces, tmp_path), "-o", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.stderr
    assert "unmatched: ncclAllGather (group 0, seq 3) issued by rank(s) 0, 2, never by 1" in res.stdout


def test_different_calls_at_one_sequence_number_are_mismatched():
    traces = [rank_trace(0, extra=(("ncclAllGather", "0", 3, 10),)), rank_trace(1, extra=(("ncclBroadcast", "0", 3, 10),)),
              rank_trace(2, extra=(("ncclAllGather", "0", 3, 10),))]
    s = summary(traces)
    assert s["mismatched"] == [{"group": "0", "seq": 3,
                                "calls": {"0": "ncclAllGather", "1": "ncclBroadcast", "2": "ncclAllGather"}}]
    assert s["collectives"][2]["call"] == "ncclAllGather / ncclBroadcast"


def test_point_to_point_calls_count_but_are_not_paired():
    # ranks 0 -> 1 and 2 -> 0 share a sequence number; they are different transfers
    traces = [rank_trace(0, extra=(("ncclSend", "0", 3, 10), ("ncclRecv", "0", 4, 10))),
              rank_trace(1, extra=(("ncclRecv", "0", 3, 10),)),
              rank_trace(2, extra=(("ncclSend", "0", 4, 10),))]
    s = summary(traces)
    assert [r["point_to_point"] for r in s["ranks"]] == [2, 1, 1]
    assert [r["collectives"] for r in s["ranks"]] == [4, 3, 3]
    assert [c["seq"] for c in s["collectives"]] == [1, 2] and s["unmatched"] == []
    assert sum(e["ph"] == "s" for e in merge(traces)["traceEvents"]) == 4


def test_families_that_disagree_are_merged_and_reported():
    traces = [rank_trace(0), rank_trace(1, family="rocm-like"), rank_trace(2)]
    doc = merge(traces)
    s = doc["otherData"]["summary"]
    assert s["family"] == "mixed" == doc["otherData"]["family"]
    assert s["warnings"] == ["the ranks run different families: rank 0 cuda-like, rank 1 rocm-like, "
                             "rank 2 cuda-like"]
    assert [r["family"] for r in s["ranks"]] == ["cuda-like", "rocm-like", "cuda-like"]


def test_several_nodes_are_named():
    doc = merge([rank_trace(r, 2, node=r, fwd_us=[100, 50]) for r in range(2)])
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["rank 0 · cuda-like · node 0 · device 0 (tiny)", "rank 1 · cuda-like · node 1 · device 0 (tiny)"]
    assert doc["otherData"]["summary"]["collectives"][0]["last_rank"] == 0


# ---- bad input -------------------------------------------------------------------------------------
def _error(traces, **kw) -> str:
    with pytest.raises(TraceMergeError) as exc:
        merge(traces, **kw)
    with pytest.raises(TraceMergeError):
        summary(traces, **kw)
    assert isinstance(exc.value, ValueError)
    return str(exc.value)


def test_not_a_trace(fresh):
    assert "trace 1 is not a Chrome / Perfetto trace document" in _error([fresh[0], {"events": []}, fresh[2]])
    assert "b.json is not a Chrome / Perfetto trace" in _error([fresh[0], [1, 2]], sources=["a.json", "b.json"])
    assert _error([]) == "no traces to merge — pass every rank's trace"


def test_a_trace_without_a_rank(fresh):
    del fresh[1]["otherData"]["rank"]
    assert "trace 1 has no otherData.rank: it is not one rank's trace" in _error(fresh)
    assert "is a merged trace already" in _error([merge(copy.deepcopy([rank_trace(0, 1, [10])]))])
    fresh[1]["otherData"]["rank"] = "1"
    assert "trace 1: otherData.rank is '1', not a whole number >= 0" in _error(fresh)
    fresh[1]["otherData"]["rank"] = 3
    assert "trace 1: rank 3 is outside a world of 3" in _error(fresh)


def test_duplicate_ranks(fresh):
    fresh[2]["otherData"]["rank"] = 0
    assert _error(fresh, sources=["r0.json", "r1.json", "r2.json"]).startswith(
        "rank 0 appears twice: r0.json and r2.json")


def test_missing_ranks_are_named():
    traces = [rank_trace(r, 4, [100, 200, 0, 150]) for r in (0, 1, 3)]
    assert _error(traces).startswith("world size 4 but rank 2 is missing (given ranks 0, 1, 3)")
    assert _error(traces[:1]).startswith("world size 4 but ranks 1, 2, 3 are missing (given rank 0)")


def test_world_sizes_that_disagree(fresh):
    fresh[1]["otherData"]["world_size"] = 2
    assert _error(fresh).startswith("the traces disagree on the world size: rank 0 says 3, "
                                    "rank 1 says 2, rank 2 says 3")


def test_malformed_events_and_several_devices(fresh):
    bad = copy.deepcopy(fresh)
    next(e for e in bad[1]["traceEvents"] if e["ph"] == "X")["ts"] = "soon"
    assert _error(bad).startswith("trace 1: event 'fwd' ts is 'soon', not a number")
    bad = copy.deepcopy(fresh)
    next(e for e in bad[2]["traceEvents"] if e.get("cat") == "collective")["args"]["seq"] = 1.5
    assert _error(bad).startswith("trace 2: event 'ncclAllReduce seq 1' seq is 1.5, not a whole number")
    two = copy.deepcopy(fresh)
    two[0]["traceEvents"].append({**two[0]["traceEvents"][0], "pid": 7})
    assert "trace 0 holds 2 devices" in _error(two)


# ---- the command -------------------------------------------------------------------------------------
def _write(traces, folder) -> list[str]:
    paths = []
    for t in traces:
        p = folder / f"rank{t['otherData']['rank']}.trace.json"
        p.write_text(json.dumps(t))
        paths.append(str(p))
    return paths


def run(*args):
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_merge_a_directory_prints_the_table_and_writes_the_trace(traces, tmp_path):
    _write(traces, tmp_path)
    (tmp_path / "notes.json").write_text("{}")             # not rank*.trace.json: not taken
    out = tmp_path / "merged.json"
    code, stdout, stderr = run("trace", "merge", str(tmp_path), "-o", str(out))
    assert code == 0 and stderr == ""
    assert json.loads(out.read_text()) == json.loads(json.dumps(merge(traces)))
    assert "3 ranks · cuda-like · simulated µs" in stdout and f"wrote {out}" in stdout
    rows = {line.split()[0]: line.split() for line in stdout.splitlines()
            if line.split() and line.split()[0] in "012" and len(line.split()) == 10}
    assert rows["0"] == ["0", "0", "130.00", "20.00", "240.00", "2", "150.00", "210.00", "12%", "0"]
    assert rows["1"][-4:] == ["0.00", "60.00", "33%", "1"]
    assert "stragglers" in stdout and "220.00 µs" in stdout


def test_merge_json_prints_the_summary_only(traces, tmp_path):
    files = _write(traces, tmp_path)
    out = tmp_path / "merged.json"
    code, stdout, _ = run("trace", "merge", *files, "-o", str(out), "--json")
    assert code == 0
    doc = json.loads(stdout)
    validate(doc)
    assert doc == json.loads(json.dumps(summary(traces))) == json.loads(out.read_text())["otherData"]["summary"]


@pytest.mark.parametrize("case, message", [
    ("missing", "fornax: error: world size 3 but rank 1 is missing (given ranks 0, 2)"),
    ("not json", "is not a trace JSON file"),
    ("no rank", "has no otherData.rank"),
    ("empty dir", "holds no rank*.trace.json files"),
    ("no such", "no such file or directory"),
    ("bad output", "cannot write"),
])
def test_merge_errors_are_one_line_and_exit_2(traces, tmp_path, case, message):
    files = _write(traces, tmp_path)
    out = str(tmp_path / "merged.json")
    args = files
    if case == "missing":
        args = [files[0], files[2]]
    elif case == "not json":
        (tmp_path / "junk.json").write_text("{not json")
        args = [*files, str(tmp_path / "junk.json")]
    elif case == "no rank":
        (tmp_path / "plain.json").write_text(json.dumps({"traceEvents": []}))
        args = [str(tmp_path / "plain.json")]
    elif case == "empty dir":
        (tmp_path / "empty").mkdir()
        args = [str(tmp_path / "empty")]
    elif case == "no such":
        args = [str(tmp_path / "nope")]
    elif case == "bad output":
        out = str(tmp_path / "no-dir" / "merged.json")
    code, stdout, stderr = run("trace", "merge", *args, "-o", out)
    assert code == 2 and stdout == ""
    assert message in stderr and stderr.startswith("fornax: error: ") and stderr.count("\n") == 1


def test_the_installed_command(traces, tmp_path):
    """As a user runs it: listed in --help; a usage mistake is one line with exit code 2."""
    _write(traces[:2], tmp_path)
    code, stdout, _ = run("--help")
    assert code == 0 and "trace" in stdout.split("Commands:")[1]
    p = subprocess.run([sys.executable, "-m", "fornax.cli", "trace", "merge", str(tmp_path), "-o",
                        str(tmp_path / "m.json")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "fornax: error: world size 3 but rank 2 is missing (given ranks 0, 1) — pass every rank's trace\n"
    code, _, stderr = run("trace", "merge", "-o", str(tmp_path / "m.json"))
    assert code == 2 and "Missing argument 'FILES...'" in stderr
