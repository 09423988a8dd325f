"""The Chrome/Perfetto trace of the simulated timeline (``fornax compose --trace``)."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.sim.device import Device
from fornax.sim.faults import PageFault
from fornax.sim.spec import load_spec
from fornax.sim.timeline import Packet
from fornax.sim.trace import chrome_trace
from helpers import FAMILIES

REQUIRED = {
    "M": {"name", "ph", "pid", "tid", "args"},
    "X": {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"},
    "i": {"name", "ph", "ts", "pid", "tid", "s", "args"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "s": {"name", "cat", "ph", "id", "ts", "pid", "tid"},      # flows: API call -> device work
    "f": {"name", "cat", "ph", "id", "ts", "pid", "tid"},
}
EPS = 1e-6          # µs: rounding slack when comparing end and start times


def check_structure(doc: dict) -> dict:
    """Schema checks every trace must pass; returns the thread names by (pid, tid)."""
    assert set(doc) >= {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] == "ns"
    json.dumps(doc)                                       # plain JSON all the way down
    processes, threads = set(), {}
    for ev in doc["traceEvents"]:
        assert ev["ph"] in REQUIRED, ev
        missing = REQUIRED[ev["ph"]] - set(ev)
        assert not missing, (missing, ev)
        if ev["ph"] == "M" and ev["name"] == "process_name":
            processes.add(ev["pid"])
        if ev["ph"] == "M" and ev["name"] == "thread_name":
            assert ev["args"]["name"]
            threads[(ev["pid"], ev["tid"])] = ev["args"]["name"]
        if ev["ph"] in "XiC":
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
            assert ev["pid"] in processes or any(
                e.get("name") == "process_name" and e["pid"] == ev["pid"] for e in doc["traceEvents"])
        if ev["ph"] == "X":
            assert ev["dur"] >= 0
            assert (ev["pid"], ev["tid"]) in threads, f"X event on an unnamed track: {ev}"
        if ev["ph"] == "i":
            assert ev["s"] in ("t", "p", "g")
            if ev["s"] == "t":
                assert (ev["pid"], ev["tid"]) in threads
        if ev["ph"] == "C":
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values())
    # per track: timestamps never go back; an engine runs one packet at a time
    by_track = defaultdict(list)
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X":
            by_track[(ev["pid"], ev["tid"])].append(ev)
    for key, evs in by_track.items():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts), f"timestamps go back on {threads[key]}"
        for a, b in zip(evs, evs[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - EPS, \
                f"{a['name']} and {b['name']} overlap on {threads[key]}"
    return threads


@pytest.mark.parametrize("vendor", FAMILIES)
def test_compose_writes_a_trace_that_matches_the_report(vendor, tmp_path):
    path = tmp_path / "run.trace.json"
    res = CliRunner().invoke(main, ["compose", "--vendor", vendor, "--workload", "mlp-softmax",
                                    "--json", "--trace", str(path)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    doc = json.loads(path.read_text())
    threads = check_structure(doc)
    names = set(threads.values())
    assert "engine compute" in names and "engine copy0" in names
    assert any(n.startswith("queue 0 (") and vendor in n for n in names)
    # every kernel of the report is an X event on the compute engine with its duration
    compute = [tid for (pid, tid), n in threads.items() if pid == 1 and n == "engine compute"]
    on_compute = defaultdict(list)
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X" and ev["tid"] in compute and ev["cat"] == "kernel":
            on_compute[ev["name"]].append(ev["dur"])
    expected = defaultdict(list)
    for k in report["kernels"]:
        expected[k["name"]].append(k["device_time_s"] * 1e6)
    assert report["kernels"]
    assert set(on_compute) == set(expected)
    for name in expected:
        assert sorted(on_compute[name]) == pytest.approx(sorted(expected[name]), rel=1e-9), name
    kernel_ev = next(ev for ev in doc["traceEvents"] if ev["ph"] == "X" and ev["cat"] == "kernel")
    assert {"grid", "bytes", "bound"} <= set(kernel_ev["args"])
    copies = [ev for ev in doc["traceEvents"] if ev["ph"] == "X" and ev["cat"] == "copy"]
    assert sum(ev["args"]["bytes"] for ev in copies
               if ev["args"]["direction"] == "h2d" and ev["tid"] < 1000) == report["costs"]["h2d_bytes"]
    # the last packet ends at the report's device time
    end = max(ev["ts"] + ev["dur"] for ev in doc["traceEvents"] if ev["ph"] == "X")
    assert end == pytest.approx(report["costs"]["device_time_s"] * 1e6)
    mem = [ev["args"]["bytes"] for ev in doc["traceEvents"] if ev["ph"] == "C"
           and ev["name"] == "memory in use"]
    assert mem and max(mem) <= report["costs"]["peak_device_bytes"] and max(mem) > 0


def test_trace_to_an_unwritable_path_is_one_line_error(tmp_path):
    res = CliRunner().invoke(main, ["compose", "--vendor", "cuda-like",
                                    "--trace", str(tmp_path / "no" / "such" / "dir.json")])
    assert res.exit_code == 2
    assert "--trace" in res.output and "Traceback" not in res.output


def test_faults_races_and_counters_in_a_hand_built_timeline():
    dev = Device(load_spec("tiny"), 0)
    space = dev.memory.create_space()
    m = space.map(8192)
    tl = dev.timeline
    qa, qb = tl.create_queue("writer"), tl.create_queue("reader")

    def write():
        space.write(m.va, np.ones(16, np.float32).tobytes())
        tl.annotate(writes=[(m.va, m.va + 64, "dst")], bytes=64)
        return 2e-6

    def read():
        space.read(m.va, 64)
        tl.annotate(reads=[(m.va, m.va + 64, "src")], bytes=64)
        return 1e-6

    def fault():
        raise PageFault(0xBAD000, "read", space.context, "test")

    qa.submit(Packet("compute", write, label="w", kind="kernel"))
    qb.submit(Packet("copy", read, label="r", kind="copy"))
    qb.submit(Packet("compute", fault, label="bad", kind="kernel"))
    tl.drain()
    space.unmap(m.va)
    doc = chrome_trace([dev])
    threads = check_structure(doc)
    evs = doc["traceEvents"]
    (race,) = [e for e in evs if e["ph"] == "i" and e["cat"] == "race"]
    assert race["s"] == "p" and race["ts"] == pytest.approx(0.0)
    assert {race["args"]["first"]["label"], race["args"]["second"]["label"]} == {"w", "r"}
    (flt,) = [e for e in evs if e["ph"] == "i" and e["cat"] == "fault"]
    assert threads[(flt["pid"], flt["tid"])] == "queue 1 (reader)"
    assert "0xbad000" in flt["args"]["error"]
    mem = [e["args"]["bytes"] for e in evs if e["ph"] == "C" and e["name"] == "memory in use"]
    assert mem == [m.span, 0]             # mapped at host time 0, unmapped after the drain
    assert dev.memory.used == 0
    # each packet is on its engine track and on its queue track
    w = [e for e in evs if e["ph"] == "X" and e["name"] == "w"]
    assert sorted(threads[(e["pid"], e["tid"])] for e in w) == ["engine compute", "queue 0 (writer)"]
    assert w[0]["dur"] == pytest.approx(2.0)


def test_power_counters_appear_when_the_device_keeps_samples():
    dev = Device(load_spec("tiny"), 0)
    samples = [(0.0, {"power_w": 50.0, "temp_c": 30.0}), (1e-3, {"power_w": 300.0, "temp_c": 41.5})]
    dev.power = SimpleNamespace(samples=samples)
    doc = chrome_trace([dev])
    check_structure(doc)
    got = {(e["name"], e["ts"]): e["args"]["value"] for e in doc["traceEvents"] if e["ph"] == "C"
           and e["name"] != "memory in use"}
    assert got == {("power_w", 0.0): 50.0, ("temp_c", 0.0): 30.0,
                   ("power_w", 1000.0): 300.0, ("temp_c", 1000.0): 41.5}


def test_two_devices_are_two_processes():
    devs = [Device(load_spec("tiny"), i) for i in range(2)]
    doc = chrome_trace(devs)
    check_structure(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: "device 0 (tiny)", 2: "device 1 (tiny)"}
