"""A ``jax-pjrt`` column of ``fornax compare``: plain ``jax.jit`` on the fornax PJRT platform,
in a process of its own.

JAX loads one PJRT plugin per platform per process, before it starts its backends, and the
plugin's client composes one stack.  A comparison crosses several stacks in one process, so
each ``jax-pjrt`` column runs in a fresh Python process (``python -m fornax.compare_pjrt``)
that registers the plugin for the column's stack config, warms the column up, runs it and
prints its ``fornax.report/1`` document; :func:`run_in_worker` reads it back.  A process
that already registered the plugin for that very stack runs the column in place
(:func:`plugin_client`).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from .layers.errors import ConfigError, FornaxError
from .stack import StackConfig

#: seconds a worker may take (warm-up and measured run of one workload)
WORKER_TIMEOUT_S = 900


def plugin_client(cfg: StackConfig):
    """The fornax JAX client of this process's PJRT plugin when it composes ``cfg``, else None."""
    if "jax" not in sys.modules:
        return None
    from .frameworks.jax import plugin as fp
    p = fp.plugin()
    if p is None or p.settings.stack_config() != cfg:
        return None
    import jax
    jax.devices()                        # the plugin's client is made when JAX starts its backends
    return p.clients[0].fornax if p.clients else None


def run_in_worker(prep, *, faults=None, debug: bool = False):
    """Run a prepared ``jax-pjrt`` column in a fresh process; its Outcome (the worker's report,
    its failure and the one-off costs it paid)."""
    from .compare import Outcome
    if faults is not None:
        raise ConfigError("fault injection runs in this process; a jax-pjrt column runs in a process of its "
                          "own", hint="inject faults with --framework jax")
    payload = {"config": dataclasses.asdict(prep.config), "workload": prep.workload.name, "debug": debug}
    from .frameworks.jax.plugin import without_switches
    env = without_switches()
    try:
        r = subprocess.run([sys.executable, "-m", "fornax.compare_pjrt"], input=json.dumps(payload),
                           capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise FornaxError(f"the jax-pjrt run of {prep.workload.name} took over {WORKER_TIMEOUT_S} s",
                          seam="framework", hint="run the column alone with FORNAX_PJRT set to see how far "
                                                 "it gets") from None
    if r.returncode != 0:
        tail = " ".join(r.stderr.strip().splitlines()[-1:]) or f"exit status {r.returncode}"
        raise FornaxError(f"the jax-pjrt worker for {prep.workload.name} failed: {tail}", seam="framework",
                          hint="run the column alone with FORNAX_PJRT set to see the whole error")
    doc = json.loads(r.stdout)
    return Outcome(prep.stack, doc["report"], doc["failed"], doc["one_off"])


def main() -> int:
    """The worker: register the plugin for the column's stack, warm up, run, print the report."""
    payload = json.load(sys.stdin)
    fields = dict(payload["config"])
    fields["paths"] = tuple(fields.get("paths", ()))
    cfg = StackConfig(**fields)
    from .frameworks.jax import plugin as fp
    fp.register(fp.Settings(vendor=cfg.seams["framework"], stack=cfg))
    from .compare import Column, execute, prepare, warm_up
    col = Column("worker", cfg, "jax-pjrt", payload["workload"], None)
    one_off = warm_up(col)
    fp.plugin().fresh_stack()            # the measured run reports itself alone, as a column's does
    out = execute(prepare(cfg, "jax-pjrt", payload["workload"], origin="fornax compare (jax-pjrt worker)"),
                  debug=bool(payload.get("debug")))
    json.dump({"report": out.report, "failed": out.failed, "one_off": one_off}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
