"""``jax.shard_map`` (and ``jax.pmap``, which becomes one) on the simulated devices of a
stack.

A ``shard_map`` equation whose mesh is built over the client's devices becomes one
:class:`ShardMap` instruction of the program around it.  Its body is compiled once
per mesh position, for that position's device (:class:`.pjrt.DevicePlacement`):
the same jaxpr, with ``axis_index`` a constant of the device's compiled segments
and each collective an instruction of its own (:mod:`.collectives`).  When the
instruction runs:

1. each argument is read from the client (device 0) and its block under the
   equation's ``in_specs`` is put on each position's device (through the host, as
   ``jax.device_put`` of a sharded array does);
2. the per-device programs advance together (:func:`lockstep`): each runs on its
   own device's stream until it reaches a collective; once every position has
   reached the same collective equation it runs on the library's communicators,
   and each program goes on with its results;
3. each result is assembled from the blocks its ``out_specs`` names (one position
   per block; along an axis the spec does not name, position 0's, the value being
   the same there) and put on device 0.

A mesh of jax's own devices (``jax.pmap(f)`` without ``devices=``) keeps jax's
implementation on the host, as a named fallback.  Equations inside the body are
counted in the report once, however many devices compile them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import lowering as L
from .collectives import Request, run_exchange
from .mesh import MeshLayout
from .pjrt import Client, DevicePlacement, JaxDeviceError
from .program import INSTRUCTIONS, Builder, Flat, Lit, Program, build_program


@dataclass(eq=False)
class ShardMap:
    """A shard_map equation: its mesh, and its body compiled for each position's device."""

    eqn: Any
    ins: list
    outs: list
    layout: MeshLayout
    bodies: list[Program]               # per mesh position
    in_specs: tuple
    out_specs: tuple
    route = "spmd"

    def run(self, prog: Program, env: dict) -> None:
        client = prog.client
        assert isinstance(client, Client), "a shard_map runs in a program of the client"
        placements = [client.placement(d) for d in self.layout.devices]
        hosts = [np.asarray(a.val) if isinstance(a, Lit) else env[a].to_numpy() for a in self.ins]
        args = []
        for k, (pl, body) in enumerate(zip(placements, self.bodies)):
            args.append([pl.value_from_pyval(h[self.layout.block(spec, h.shape, k)], r.aval)
                         for h, spec, r in zip(hosts, self.in_specs, body.ins)])
        results = lockstep(client, self.layout, placements, self.bodies, args)
        for j, (r, spec) in enumerate(zip(self.outs, self.out_specs)):
            shape = tuple(r.aval.shape)
            whole = None
            for k in self.layout.holders(spec):
                block = results[k][j].to_numpy()
                if whole is None:
                    whole = np.empty(shape, dtype=block.dtype)
                whole[self.layout.block(spec, shape, k)] = block
            env[r] = client.value_from_pyval(whole, r.aval)
        client.counts["spmd_runs"] += 1

    def describe(self, indent: str) -> str:
        head = (f"{indent}shard_map over mesh {self.layout.describe()} on devices "
                f"{list(self.layout.devices)}; each device runs:")
        return head + "\n" + self.bodies[0].describe(indent + "  ")


def lockstep(client: Client, layout: MeshLayout, placements: list[DevicePlacement],
             bodies: list[Program], args: list[list]) -> list[list]:
    """Run every position's program on its device until all have returned, meeting at each
    collective: each position's results."""
    steps = [body.steps(a) for body, a in zip(bodies, args)]
    done: list[Any] = [None] * len(steps)

    def advance(k: int, answer: Any) -> Request | None:
        with placements[k].current():
            try:
                return steps[k].send(answer)
            except StopIteration as stop:
                done[k] = stop.value
                return None

    reqs = [advance(k, None) for k in range(len(steps))]
    while any(r is not None for r in reqs):
        first = next(r for r in reqs if r is not None)
        if any(r is None or r.eqn is not first.eqn for r in reqs):
            where: dict[str, list[int]] = {}
            for k, r in enumerate(reqs):
                where.setdefault("returned" if r is None else f"reached {r}", []).append(
                    layout.devices[k])
            raise JaxDeviceError(
                "the devices of the shard_map over mesh " + layout.describe() + " diverged: " +
                "; ".join(f"device(s) {ds} {what}" for what, ds in where.items()), seam="framework",
                op=str(first), hint="every device must reach the same collectives in the same order "
                                    "(a branch on axis_index must not hold a collective only one side has)")
        answers = run_exchange(client, layout, placements, [r for r in reqs if r is not None])
        reqs = [advance(k, answers[k]) for k in range(len(steps))]
    return done


def _build(builder: Builder, e: Flat) -> ShardMap | str:
    p = e.eqn.params
    client = builder.client
    if builder.axes is not None or not isinstance(client, Client):
        raise JaxDeviceError("a shard_map inside a shard_map body is not supported", seam="framework",
                             op="shard_map", hint="name every axis in the outer shard_map's mesh")
    layout = MeshLayout.of(p["mesh"], client)
    if isinstance(layout, str):
        return layout
    manual = set(p.get("manual_axes") or p.get("newly_manual_axes") or ())
    auto = [a for a in layout.names if a not in manual]
    if auto:
        raise JaxDeviceError(
            f"shard_map over mesh {layout.describe()} leaves axes {', '.join(map(repr, auto))} to "
            "the compiler (axis_names= a subset of the mesh); fornax runs fully manual bodies only",
            seam="framework", op="shard_map",
            hint="drop axis_names (every mesh axis manual), or a mesh of the manual axes only")
    jaxpr = p["jaxpr"]
    jaxpr, consts = L.open_jaxpr(jaxpr)
    if jaxpr.constvars and not consts:
        raise JaxDeviceError("the shard_map body has constants jax did not pass in",
                             seam="framework", op="shard_map",
                             hint="pass the constants as arguments of the shard_map")
    bodies = []
    routes: Counter = Counter()
    reasons: dict = {}
    for k, device in enumerate(layout.devices):
        pl = client.placement(device)
        with pl.current():
            bodies.append(build_program(pl, p["jaxpr"], f"{builder.name}_shard{k}", layout.axis_env(k)))
        if k == 0:
            routes, reasons = Counter(client.routes), dict(client.reasons)
    # every device compiles the same body: its equations are counted once (the first device's)
    client.routes, client.reasons = routes, reasons
    return ShardMap(e.eqn, e.ins, e.outs, layout, bodies, tuple(p["in_specs"]), tuple(p["out_specs"]))


INSTRUCTIONS["shard_map"] = _build
