"""JAX front end: jaxprs into fornax's graph IR on any composed stack, behind a
PJRT-shaped device interface.

* :func:`jit` traces a function to a jaxpr (nested ``jit``, ``custom_jvp`` /
  ``custom_vjp``, ``checkpoint``, ``cond`` / ``while`` / ``scan``), lowers it
  into graph IR segments compiled by the stack's compiler seam, runs it on the
  simulated device and returns jax arrays (:mod:`.api`, :mod:`.program`).
* :mod:`.pjrt`: the client / devices / buffers / compile / execute / events
  interface JAX itself talks to; :func:`devices` and :func:`device_put` reach it.
* :mod:`.lowering` and the rule modules (:mod:`.primitives`, :mod:`.indexing`,
  :mod:`.rng`, :mod:`.windows`): one lowering rule per jax primitive; a primitive without one runs
  on the host as a named fallback, counted in :func:`report`.
* :mod:`.shard_map`, :mod:`.collectives`, :mod:`.mesh`: ``jax.shard_map`` / ``jax.pmap``
  programs over a mesh of the stack's devices (:func:`mesh`), each device running its shard,
  the collectives on the library's communicators.
"""

from __future__ import annotations

from . import indexing, primitives, rng, windows  # noqa: F401  (they register their lowering rules)
from . import collectives, shard_map  # noqa: F401  (they register their instruction builders)
from .api import Jitted, client, device_put, devices, jit, mesh, resolve, use_stack
from .lowering import RULES, NotLowerable
from .pjrt import Buffer, Client, Device, DevicePlacement, Event, JaxDeviceError, LoadedExecutable


def report(stack=None) -> dict:
    """What the JAX front end did on the default client (or ``stack``'s): equations per
    primitive and route, fallbacks with reasons, programs, segments, transfers."""
    return resolve(stack).report()


__all__ = ["Buffer", "Client", "Device", "DevicePlacement", "Event", "JaxDeviceError", "Jitted",
           "LoadedExecutable", "NotLowerable", "RULES", "client", "device_put", "devices", "jit", "mesh",
           "report", "resolve", "use_stack"]
