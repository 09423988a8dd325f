"""L4, compile: ``torch.compile(backend='fornax')`` forward+backward matches eager CPU (an
MLP and the real models), and ``fornax.frameworks.jax.jit`` of an MLP's value and gradient
and of equinox/optax programs matches ``jax.jit``."""

from __future__ import annotations

import numpy as np

from ..contracts.clause import Outcome
from .. import qualify_clients as narrow
from .clients import need, zoo_outcome
from .levels import TOL, evidence
from .measure import fmt, worst_error
from .models import mlp, train_step
from .subject import StackSubject


@evidence("L4", "torch_compile", "torch.compile(model, backend='fornax') forward+backward matches "
          "eager CPU", seam="compiler", measured="worst normwise error of output, loss and grads vs CPU",
          relation="<=", limit=TOL["float32"], dtype="float32", shape="MLP x [4, 16] -> 32 -> 8")
def _l4_torch_compile(s: StackSubject) -> Outcome:
    pairs, routes = train_step(s, mlp, (4, 16), s.config.seed + 40, compile_=True)
    err, worst = worst_error(pairs)
    runs = {op: n for (op, kind), n in routes.items() if op.startswith("graph run:")}
    native_runs = sum(n for (op, kind), n in routes.items()
                      if op.startswith("graph run:") and kind == "native")
    refused = [op.removeprefix("graph run:") for (op, kind) in routes
               if op.startswith("graph run:") and kind == "fallback"]
    problems = []
    if native_runs < 2:
        problems.append(f"{native_runs} compiled graph run(s) on the device (want the forward and "
                        "the backward graph)" + (f"; refused: {', '.join(refused)}" if refused else ""))
    if err > TOL["float32"]:
        problems.append(f"worst {worst} {fmt(err)}")
    detail = (f"{native_runs} compiled graph runs on the device ({', '.join(sorted(runs))}); "
              f"worst {worst} {fmt(err)}")
    return Outcome(err, not problems, "; ".join(problems) or detail)


@evidence("L4", "jax_jit", "fornax.frameworks.jax.jit of an MLP's loss and gradient matches jax.jit",
          seam="compiler", measured="worst normwise error of loss and grads vs jax.jit (CPU)",
          relation="<=", limit=TOL["float32"], dtype="float32", shape="x [5, 8] -> 16 (tanh) -> 4")
def _l4_jax_jit(s: StackSubject) -> Outcome:
    import jax
    import jax.numpy as jnp

    from ..frameworks.jax import jit, resolve
    rng = np.random.default_rng(s.config.seed + 41)
    params = {"w1": rng.standard_normal((8, 16)).astype(np.float32) / 3,
              "b1": rng.standard_normal(16).astype(np.float32),
              "w2": rng.standard_normal((16, 4)).astype(np.float32) / 4}
    x = rng.standard_normal((5, 8)).astype(np.float32)

    def loss(p, x):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"]) ** 2)

    step = jax.value_and_grad(loss)
    client = resolve(s.stack)
    before = dict(client.routes)
    got = jit(step, stack=s.stack)(params, x)
    want = jax.jit(step)(params, x)
    routes = {k: n - before.get(k, 0) for k, n in client.routes.items() if n != before.get(k, 0)}
    pairs = {"loss": (np.asarray(got[0]), np.asarray(want[0]))}
    for k in params:
        pairs[f"d{k}"] = (np.asarray(got[1][k]), np.asarray(want[1][k]))
    err, worst = worst_error(pairs)
    native = sum(n for (_, route), n in routes.items() if route == "native")
    host = sorted({prim for (prim, route) in routes if route == "fallback"})
    problems = []
    if native == 0:
        problems.append("no equation ran on the device")
    if err > TOL["float32"]:
        problems.append(f"worst {worst} {fmt(err)}")
    detail = (f"{native} equations lowered to the device"
              + (f", host fallbacks: {', '.join(host)}" if host else ", no host fallback")
              + f"; worst {worst} {fmt(err)}")
    return Outcome(err, not problems, "; ".join(problems) or detail)


@evidence("L4", "zoo_compile", "the same models through torch.compile(backend='fornax') forward+"
          "backward match CPU", seam="compiler", measured="models matching CPU", relation="==",
          limit="all", dtype="float32", shape="small configs, random weights")
def _l4zoo_outcome(s: StackSubject) -> Outcome:
    return zoo_outcome(s, ("compile",))


@evidence("L4", "jax_ecosystem", "equinox/optax programs (CNN with max-pooling, attention, lax.scan "
          "GRU, optimisers with schedules) through fornax.frameworks.jax.jit match jax.jit, no host "
          "fallback", seam="compiler", measured="programs matching jax.jit", relation="==",
          limit="all", dtype="float32")
def _l4_jax_ecosystem(s: StackSubject) -> Outcome:
    need("equinox", "optax")
    from ..scenarios import jax_zoo
    results = [jax_zoo.run_program(name, stack=s.stack) for name in narrow.JAX_PROGRAMS or jax_zoo.ZOO]
    bad = [r for r in results if not r.ok]
    problems = []
    for r in bad:
        out, err = r.worst
        problems.append(f"{r.name}: " + (r.error or (f"host fallbacks {[f['primitive'] for f in r.fallbacks]}"
                                                     if r.fallbacks else f"{out} normwise {err:.2e}")))
    worst = max(results, key=lambda r: r.worst[1])
    detail = (f"{len(results)} programs match jax.jit with no host fallback; largest error "
              f"{worst.worst[1]:.2e} ({worst.name} {worst.worst[0]})")
    return Outcome(f"{len(results) - len(bad)}/{len(results)}", not bad,
                   "; ".join(problems) or detail, [r.to_json() for r in results])
