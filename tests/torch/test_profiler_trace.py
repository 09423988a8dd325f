"""torch.profiler on fornax, as one Chrome / Perfetto trace: Kineto's host events as PyTorch
wrote them, the simulated device timeline and API call track in processes of their own,
and a flow arrow from each ATen op slice to each kernel it launched."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import profiler as fp
from fornax.layers.errors import InvalidArgumentError

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


@pytest.fixture(scope="module")
def model():
    ft.use_stack("cuda-like", spec="tiny")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("fornax")
    x = torch.randn(32, 64, device="fornax")
    net(x).sum().item()                                  # compile and warm up outside the window
    return net, x


@pytest.fixture(scope="module")
def traced(model, tmp_path_factory):
    net, x = model
    driver = ft.stack().driver
    first = driver.counts["launches"]
    timeline = ft.stack().devices[0].timeline
    opened = timeline.host_time                           # the host's simulated clock
    with profile(activities=ACTIVITIES) as prof:
        net(x).sum().item()
    window = (opened, timeline.host_time,       # each kernel the timeline ran in the window, by its µs
              {r.start * 1e6: r for r in timeline.records if r.kind == "kernel" and r.start >= opened})
    path = tmp_path_factory.mktemp("trace") / "model.trace.json"
    returned = fp.export_chrome_trace(prof, path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    kernels = [k for k in driver.kernel_log if k.launch > first]
    # PyTorch's own export still works after fornax's (Kineto writes a trace once), and its
    # Python exporter writes the same Kineto results independently
    folder = tmp_path_factory.mktemp("kineto")
    prof.export_chrome_trace(str(folder / "own.json"))
    prof.export_chrome_trace(str(folder / "python.json"), use_python_export=True)
    kineto = {name: json.loads((folder / f"{name}.json").read_text(encoding="utf-8")) for name in ("own", "python")}
    return doc, returned, prof, kernels, kineto, window


def _processes(events):
    return {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}


def _fornax_pids(events):
    return {pid for pid, name in _processes(events).items() if name.startswith("fornax ")}


def _kernel_slices(events):
    """The fornax kernel slices on their queue tracks (each packet is also on its engine's)."""
    pids = _fornax_pids(events)
    return [e for e in events if e.get("ph") == "X" and e["pid"] in pids and e.get("cat") == "kernel"
            and e["tid"] >= 1000]


def test_the_trace_keeps_kinetos_events_and_adds_the_window_of_simulated_device_time(traced):
    doc, returned, prof, kernels, kineto, (opened, closed, ran) = traced
    events = doc["traceEvents"]
    assert returned["traceEvents"] == events and doc["otherData"]["fornax"]["host_export"] == "kineto"
    # Kineto's events come first, as PyTorch's own export writes them
    own = kineto["own"]
    assert events[: len(own["traceEvents"])] == own["traceEvents"]
    assert doc["baseTimeNanoseconds"] == own["baseTimeNanoseconds"] == kineto["python"]["baseTimeNanoseconds"]
    host_ops = [e for e in kineto["python"]["traceEvents"] if e.get("cat") == "cpu_op"]
    assert host_ops and [e for e in events if e.get("cat") == "cpu_op"] == host_ops
    assert doc["schemaVersion"] == 1 and "traceName" not in doc and own["traceName"].endswith("own.json")
    addmm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    assert len(addmm) == 2
    # the device lives in a process of its own, named for its clock, on a pid Kineto does not use
    fornax = _fornax_pids(events)
    assert [_processes(events)[p] for p in fornax] == ["fornax device 0 (tiny) · simulated time"]
    assert not fornax & {e.get("pid") for e in own["traceEvents"]}
    # exactly the window's kernels (none of the warm-up's), each its simulated duration long
    slices = sorted(_kernel_slices(events), key=lambda e: e["ts"])
    assert kernels and len(slices) == len(kernels)
    assert [s["name"] for s in slices] == [k.name for k in kernels]
    for s, k in zip(slices, kernels):
        assert s["dur"] == pytest.approx(k.duration_s * 1e6, rel=1e-12, abs=1e-9)
    # the window's simulated start sits at the profile's start on the host clock
    info = doc["otherData"]["fornax"]
    span = next(e for e in events if e.get("cat") == "Trace" and e["name"].startswith("PyTorch Profiler"))
    assert info["host_start_us"] == pytest.approx(span["ts"], abs=1e-3)
    window = info["windows"][0]
    assert (window["simulated_start_us"], window["simulated_end_us"]) == (opened * 1e6, closed * 1e6)
    assert len(ran) == len(kernels)
    for s in slices:
        rec = ran[s["args"]["simulated_us"]]             # the timeline's record of this kernel
        assert rec.label == s["name"]
        assert s["ts"] - info["host_start_us"] == pytest.approx((rec.start - opened) * 1e6, abs=1e-3)
        assert s["ts"] >= info["host_start_us"] - 1e-3


def test_each_op_slice_has_an_arrow_to_each_kernel_it_launched(traced):
    doc, _, prof, kernels, _, _ = traced
    events = doc["traceEvents"]
    flows = [e for e in events if e.get("cat") == "fornax" and e.get("ph") in ("s", "f")]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) == len(flows) // 2 == len(kernels) == doc["otherData"]["fornax"]["launch_flows"]
    assert starts.keys() == ends.keys()
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    slices = _kernel_slices(events)
    launched: dict[int, list[str]] = {}
    for fid, s in starts.items():
        f = ends[fid]
        assert s["bp"] == f["bp"] == "e"
        op = [o for o in ops if (o["pid"], o["tid"]) == (s["pid"], s["tid"]) and o["name"] == s["args"]["op"]
              and o["ts"] <= s["ts"] <= o["ts"] + o["dur"]]
        assert op, f"flow {fid} starts on no {s['args']['op']} slice"
        on = [k for k in slices if (k["pid"], k["tid"], k["ts"]) == (f["pid"], f["tid"], f["ts"])]
        assert [k["name"] for k in on] == [f["args"]["kernel"]]
        launched.setdefault(op[0]["args"]["External id"], []).append(on[0]["name"])
    # each op's arrows lead to the kernels PyTorch's parsed events attach to that op
    attached = {e.id: [k.name for k in e.kernels] for e in prof.events() if e.kernels}
    assert {k: sorted(v) for k, v in launched.items()} == {k: sorted(v) for k, v in attached.items()}
    assert sorted(op for op in (starts[i]["args"]["op"] for i in starts)) == \
        sorted(["aten::addmm"] * 6 + ["aten::relu"] + ["aten::sum"] * 2)
    # the arrows' ids are their own: none is an API-track flow's
    api = {e["id"] for e in events if e.get("cat") == "api" and e.get("ph") in ("s", "f")}
    assert api and not api & starts.keys()


def test_the_api_call_track_is_in_the_device_process(traced):
    doc, _, _, kernels, _, _ = traced
    events = doc["traceEvents"]
    fornax = _fornax_pids(events)
    tracks = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
              and e["pid"] in fornax}
    assert {"host thread 1 · CUDA runtime API", "host thread 1 · CUDA driver API"} <= tracks
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "api" and e["pid"] in fornax]
    assert sum(1 for c in calls if c["name"] == "cudaLaunchKernel") == len(kernels)
    slices = {(k["pid"], k["tid"], k["ts"]) for k in _kernel_slices(events)}
    api_ends = [e for e in events if e.get("cat") == "api" and e.get("ph") == "f"]
    assert sum(1 for f in api_ends if (f["pid"], f["tid"], f["ts"]) in slices) == len(kernels)


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events at the end of each cycle")
def test_the_handler_writes_each_window_and_bad_input_is_refused(model, tmp_path):
    net, x = model
    with profile(activities=ACTIVITIES, schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
                 on_trace_ready=fp.trace_handler(tmp_path / "run.{step}.json")) as cycles:
        for _ in range(4):
            net(x).relu().sum().item()
            cycles.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.2.json", "run.4.json"]
    docs = [json.loads((tmp_path / f"run.{step}.json").read_text(encoding="utf-8")) for step in (2, 4)]
    for doc in docs:                                     # one window each, its own kernels
        assert doc["otherData"]["fornax"]["launch_flows"] == len(_kernel_slices(doc["traceEvents"])) == 10
    first, second = (doc["otherData"]["fornax"]["windows"][0] for doc in docs)
    assert first["simulated_end_us"] <= second["simulated_start_us"]

    with profile(activities=[ProfilerActivity.CPU]) as cpu_only:
        net(x).sum().item()
    with pytest.raises(InvalidArgumentError, match="PrivateUse1"):
        fp.export_chrome_trace(cpu_only, tmp_path / "cpu.json")
    with profile(activities=ACTIVITIES) as no_device:
        torch.ones(4).sum()
    with pytest.raises(InvalidArgumentError, match="no op reached the fornax device"):
        fp.export_chrome_trace(no_device, tmp_path / "none.json")
    with pytest.raises(InvalidArgumentError, match="not a torch.profiler profile"):
        fp.export_chrome_trace(object(), tmp_path / "none.json")
    with profile(activities=ACTIVITIES) as prof:
        net(x).sum().item()
    with pytest.raises(InvalidArgumentError, match="cannot write the trace"):
        fp.export_chrome_trace(prof, tmp_path / "no-such-folder" / "t.json")
    # PyTorch's own export first: Kineto will not write the trace twice, PyTorch's Python
    # exporter writes it for the merged trace
    prof.export_chrome_trace(str(tmp_path / "own.json"))
    doc = fp.export_chrome_trace(prof, tmp_path / "merged.json")
    assert doc["otherData"]["fornax"]["host_export"] == "pytorch-python"
    assert doc["otherData"]["fornax"]["launch_flows"] == len(_kernel_slices(doc["traceEvents"])) > 0
    assert sum(1 for e in doc["traceEvents"] if e.get("name") == "aten::addmm") == 2
    assert not (tmp_path / "cpu.json").exists() and not (tmp_path / "none.json").exists()
