"""Topology: peer-copy and collective times against hand-derived alpha-beta formulas.

Every expected time below is written out from the fabric's definition
(B = the spec's peer bandwidth per device, a = per-hop latency; a switch gives
each device one port of B, a mesh splits B over N-1 links, a ring gives each of
the two neighbour links B/2), not taken from the code.  A ring collective on a
full mesh stripes each step over N-1 channels, one per link, so its steps get
all of B, as on a switch (NCCL/RCCL channels).
"""

from __future__ import annotations

import math

import pytest

from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.sim.topology import Topology

N = 8
BIG = 1 << 30          # 1 GiB: bandwidth-dominated
SMALL = 64             # latency-dominated


@pytest.fixture(scope="module")
def spec():
    return load_spec("tiny")


@pytest.fixture(scope="module")
def fabric(spec):
    return {kind: Topology.build(spec, N, kind) for kind in ("switch", "mesh", "ring")}


def ab(spec):
    return spec.peer_link_latency_s, spec.peer_link_bandwidth


def close(got, want):
    assert math.isclose(got, want, rel_tol=1e-12), (got, want)


# -- the figures the fabrics are built from ----------------------------------------------
def test_spec_peer_figures_used():
    s = load_spec("tiny")
    assert (s.peer_link_bandwidth, s.peer_link_latency_s) == (20.0e9, 3.0e-6)


def test_link_bandwidths_per_kind(spec, fabric):
    a, b = ab(spec)
    assert fabric["switch"].link_bandwidth == b
    close(fabric["mesh"].link_bandwidth, b / 7)
    close(fabric["ring"].link_bandwidth, b / 2)
    # directed links: 2 per device into/out of the switch, N(N-1) in a mesh, 2N in a ring
    assert len(fabric["switch"].links) == 2 * N
    assert len(fabric["mesh"].links) == N * (N - 1)
    assert len(fabric["ring"].links) == 2 * N


# -- point to point -----------------------------------------------------------------------
@pytest.mark.parametrize("n", [BIG, SMALL])
def test_peer_copy_0_to_5(spec, fabric, n):
    a, b = ab(spec)
    close(fabric["switch"].peer_copy_time(n, 0, 5), a + n / b)
    close(fabric["mesh"].peer_copy_time(n, 0, 5), a + n / (b / 7))
    # on a ring of 8, device 5 is 3 hops from 0 (the short way round), cut-through
    close(fabric["ring"].peer_copy_time(n, 0, 5), 3 * a + n / (b / 2))
    assert fabric["ring"].hops(0, 5) == 3 and fabric["ring"].hops(1, 2) == 1


def test_ring_opposite_device_splits_over_both_ways(spec, fabric):
    a, b = ab(spec)
    # 0 -> 4 is 4 hops either way: half the bytes each way, each link B/2
    close(fabric["ring"].peer_copy_time(BIG, 0, 4), 4 * a + (BIG / 2) / (b / 2))


def test_concurrent_copies_share_a_switch_port(spec, fabric):
    a, b = ab(spec)
    both = fabric["switch"].phase_time([(0, 1, BIG), (0, 2, BIG)])
    close(both, a + 2 * BIG / b)
    # on a mesh they use two different links
    close(fabric["mesh"].phase_time([(0, 1, BIG), (0, 2, BIG)]), a + BIG / (b / 7))


# -- collectives ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [BIG, SMALL])
def test_ring_allreduce(spec, fabric, n):
    a, b = ab(spec)
    # a mesh's ring step leaves in 7 parts, one over each link of B/7: all of B
    for kind, link in (("switch", b), ("mesh", b), ("ring", b / 2)):
        want = 2 * (N - 1) * a + 2 * (N - 1) / N * n / link
        close(fabric[kind].allreduce_time(n, "ring"), want)
        close(fabric[kind].allreduce_time(n), want)      # ring is the default


@pytest.mark.parametrize("n", [BIG, SMALL])
def test_tree_allreduce(spec, fabric, n):
    a, b = ab(spec)
    steps = 2 * math.ceil(math.log2(N))                  # reduce up, broadcast down
    close(fabric["switch"].allreduce_time(n, "tree"), steps * (a + n / b))
    close(fabric["mesh"].allreduce_time(n, "tree"), steps * (a + n / (b / 7)))
    # ring of 8, binomial tree: partners 1, 2, 4 hops apart; level 0 on disjoint single
    # links (n / (B/2)), level 1 on disjoint 2-link paths (n / (B/2)), level 2 one
    # transfer split both ways ((n/2) / (B/2)); then the same again for the broadcast
    per_pass = (1 + 2 + 4) * a + 2 * n / b + 2 * n / b + n / b
    close(fabric["ring"].allreduce_time(n, "tree"), 2 * per_pass)


def test_all_gather_and_reduce_scatter(spec, fabric):
    a, b = ab(spec)
    for kind, link in (("switch", b), ("mesh", b), ("ring", b / 2)):
        want = (N - 1) * a + (N - 1) / N * BIG / link
        close(fabric[kind].all_gather_time(BIG), want)
        close(fabric[kind].reduce_scatter_time(BIG), want)


def test_broadcast(spec, fabric):
    a, b = ab(spec)
    # pipelined chain: latency over N-1 hops, every chain link carries the whole message
    close(fabric["switch"].broadcast_time(BIG, "ring"), (N - 1) * a + BIG / b)
    close(fabric["ring"].broadcast_time(BIG, "ring"), (N - 1) * a + BIG / (b / 2))
    close(fabric["switch"].broadcast_time(BIG, "tree"), 3 * (a + BIG / b))
    close(fabric["mesh"].broadcast_time(BIG, "tree"), 3 * (a + BIG / (b / 7)))
    # a chain from root 3 costs the same on a switch
    close(fabric["switch"].broadcast_time(BIG, "ring", root=3), (N - 1) * a + BIG / b)


def test_all_to_all(spec, fabric):
    a, b = ab(spec)
    chunk = BIG / N
    # switch: each port carries (N-1) chunks; mesh: each link one chunk at B/(N-1)
    close(fabric["switch"].all_to_all_time(BIG), a + (N - 1) * chunk / b)
    close(fabric["mesh"].all_to_all_time(BIG), a + chunk / (b / 7))
    # ring of 8, shortest-way routing: each directed link carries chunk * (1 + 2 + 3 + 4/2)
    close(fabric["ring"].all_to_all_time(BIG), 4 * a + chunk * 8 / (b / 2))


def test_large_message_ordering(fabric):
    ar = {k: t.allreduce_time(BIG) for k, t in fabric.items()}
    assert math.isclose(ar["switch"], ar["mesh"]) and ar["mesh"] < ar["ring"]
    a2a = {k: t.all_to_all_time(BIG) for k, t in fabric.items()}
    assert math.isclose(a2a["switch"], a2a["mesh"]) and a2a["mesh"] < a2a["ring"]


def test_tree_wins_small_ring_wins_large(fabric):
    sw = fabric["switch"]
    assert sw.allreduce_time(SMALL, "tree") < sw.allreduce_time(SMALL, "ring")
    assert sw.allreduce_time(BIG, "ring") < sw.allreduce_time(BIG, "tree")


def test_collective_dispatch_by_name(fabric):
    sw = fabric["switch"]
    assert sw.collective_time("allreduce", BIG, "tree") == sw.allreduce_time(BIG, "tree")
    assert sw.collective_time("all_gather", BIG) == sw.all_gather_time(BIG)
    assert sw.collective_time("all_to_all", BIG) == sw.all_to_all_time(BIG)
    with pytest.raises(ValueError, match="unknown collective"):
        sw.collective_time("gossip", BIG)


def test_one_and_two_devices(spec):
    a, b = ab(spec)
    for kind in ("switch", "mesh", "ring"):
        one = Topology.build(spec, 1, kind)
        assert one.allreduce_time(BIG) == 0.0 and one.all_to_all_time(BIG) == 0.0
        assert one.broadcast_time(BIG, "tree") == 0.0
        two = Topology.build(spec, 2, kind)
        # two devices: every kind is one link of the full bandwidth
        close(two.peer_copy_time(BIG, 1, 0), a + BIG / b)
        close(two.allreduce_time(BIG), 2 * a + BIG / b)


# -- channels: a ring collective on a full mesh uses every link -------------------------------------
def test_ring_channels_per_fabric(spec, fabric):
    assert fabric["mesh"].ring_channels() == N - 1
    assert fabric["mesh"].ring_channels([0, 3, 5]) == 2         # a subset: one per link among them
    assert fabric["switch"].ring_channels() == fabric["ring"].ring_channels() == 1
    assert fabric["mesh"].ring_channels([2, 6]) == 1              # two devices: their one link
    assert Topology.build(spec, N, "mesh", nodes=2).ring_channels() == 1   # crossing NICs


def test_ring_links_load_every_directed_link_once():
    for ring in ([0, 1, 2, 3, 4, 5, 6, 7], [3, 0, 6, 1, 7, 2, 5, 4], [1, 4, 6]):
        n = len(ring)
        used = [(ring[i], Topology.ring_link(ring, i, k)) for i in range(n) for k in range(n - 1)]
        assert sorted(used) == sorted((a, b) for a in ring for b in ring if a != b)
        assert all(Topology.ring_link(ring, i, 0) == ring[(i + 1) % n] for i in range(n))


def test_a_channel_part_is_priced_on_its_link(fabric):
    mesh = fabric["mesh"]
    assert mesh.egress(0, 1) == "peer1" and mesh.egress(0, 1, 5) == "peer5"
    assert mesh.egress(0, 1, 1) == "peer1"                     # its own link
    assert fabric["switch"].egress(0, 1, 1) == "peer"
    # only a mesh has a direct link to another device; never to the sender itself
    for topo, link in ((mesh, 0), (fabric["switch"], 5), (fabric["ring"], 5), (mesh, 9)):
        with pytest.raises(ValueError):
            topo.egress(0, 1, link)


def test_peer_link_efficiency_scales_every_link():
    import dataclasses
    tiny = load_spec("tiny")
    slow = dataclasses.replace(tiny, peer_link_efficiency=0.5)
    assert slow.peer_link_achievable == 0.5 * tiny.peer_link_bandwidth
    for kind in ("switch", "mesh", "ring"):
        fast, half = Topology.build(tiny, N, kind), Topology.build(slow, N, kind)
        assert half.port_bandwidth == fast.port_bandwidth / 2
        assert all(half.links[k] == v / 2 for k, v in fast.links.items())


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, devices, match", [
    ("torus", 4, "unknown topology 'torus'; choose one of: switch, mesh, ring"),
    ("switch", 0, "devices >= 1"),
    ("mesh", -3, "devices >= 1"),
    ("ring", True, "devices >= 1"),
    ("ring", 2.0, "devices >= 1"),
])
def test_build_rejects_bad_input(spec, kind, devices, match):
    with pytest.raises(ValueError, match=match):
        Topology.build(spec, devices, kind)


def test_bad_transfers_are_clear_errors(fabric):
    sw = fabric["switch"]
    with pytest.raises(ValueError, match="two different devices"):
        sw.peer_copy_time(16, 3, 3)
    with pytest.raises(ValueError, match=r"destination device 8 is not in this 8-device topology"):
        sw.peer_copy_time(16, 0, 8)
    with pytest.raises(ValueError, match="whole number of bytes"):
        sw.allreduce_time(-1)
    with pytest.raises(ValueError, match="whole number of bytes"):
        sw.all_gather_time(1.5)
    with pytest.raises(ValueError, match="unknown collective algorithm 'butterfly'"):
        sw.allreduce_time(16, "butterfly")


# -- joining devices ---------------------------------------------------------------------------
def test_connect_adds_one_timeline_engine_per_outgoing_link(spec):
    for kind, engines in (("switch", {"peer"}), ("ring", {"peer+", "peer-"}),
                          ("mesh", {f"peer{d}" for d in range(1, N)})):
        devs = [Device(spec, i) for i in range(N)]
        topo = Topology.build(spec, N, kind)
        topo.connect(devs)
        assert all(d.topology is topo for d in devs)
        assert {e for e in devs[0].timeline.engines if e.startswith("peer")} == engines
        assert [m.device_index for m in devs[2].memory.fabric] == [0, 1, 3, 4, 5, 6, 7]


def test_connect_checks_the_device_list(spec):
    topo = Topology.build(spec, 3)
    with pytest.raises(ValueError, match="cannot connect 2 devices"):
        topo.connect([Device(spec, 0), Device(spec, 1)])
    with pytest.raises(ValueError, match="in order"):
        topo.connect([Device(spec, 0), Device(spec, 2), Device(spec, 1)])


# -- the scale-out tier: nodes joined by NICs ---------------------------------------------------------
def test_nodes_talk_through_their_nics_and_keep_their_own_fabric():
    from fornax.sim.spec import load_spec
    spec = load_spec("h200-like")
    one = Topology.build(spec, 4, "switch")
    two = Topology.build(spec, 4, "switch", nodes=2)
    assert two.nodes == 2 and two.node_of == (0, 0, 1, 1) and one.nodes == 1
    # inside a node: the peer link; across nodes: the NIC, at its bandwidth and latency
    n = 1 << 26
    assert two.peer_copy_time(n, 0, 1) == pytest.approx(one.peer_copy_time(n, 0, 1))
    assert two.peer_copy_time(n, 1, 2) == pytest.approx(spec.nic_latency_s + n / spec.nic_bandwidth)
    assert two.egress(0, 1) == "peer" and two.egress(0, 2) == "peer-nic"
    assert "peer-nic" in two.link_engines(0) and "peer-nic" not in one.link_engines(0)
    # a ring crossing nodes is bound by the NIC, far slower than NVLink-like links
    assert two.allreduce_time(n) > 5 * one.allreduce_time(n)
    assert two.summary()["nodes"] == 2 and "nodes" not in one.summary()
    # an explicit node per device, and a ring within each node
    ring = Topology.build(spec, 4, "ring", nodes=[0, 1, 0, 1])
    assert ring.hops(0, 2) == 1 and ring.egress(0, 1) == "peer-nic" and ring.egress(0, 2) == "peer+"
    for bad in (3, 0, [0, 1], [0, -1, 0, 1], "two"):
        with pytest.raises(ValueError):
            Topology.build(spec, 4, "switch", nodes=bad)
