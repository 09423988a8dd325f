"""The project's JAX zoo (equinox CNN, attention block, GRU over lax.scan, optax training
loops) through plain ``jax.jit`` on the fornax PJRT platform, on every family, each family
in a fresh process (one plugin per process), against ``jax.jit`` on the CPU."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from fornax.scenarios import jax_zoo

ROOT = Path(__file__).resolve().parents[2]
# each family's process compares with the CPU references this process computed once
SCRIPT = """
import json, pickle, sys
from fornax.scenarios import jax_zoo
with open(sys.argv[2], "rb") as f:
    refs = pickle.load(f)
jax_zoo._reference = lambda name, seed: refs[name]
print(json.dumps([jax_zoo.run_program(n, sys.argv[1], route="pjrt").to_json() for n in jax_zoo.ZOO]))
"""


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("zoo") / "references.pkl"
    path.write_bytes(pickle.dumps({n: jax_zoo._reference(n, 0) for n in jax_zoo.ZOO}))
    return path


@pytest.mark.parametrize("vendor", jax_zoo.FAMILIES)
def test_the_zoo_through_plain_jax_jit_on_the_plugin_matches_the_cpu(vendor, references):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORNAX_PJRT", "JAX_PLATFORMS"))}
    env["FORNAX_PJRT"] = vendor
    r = subprocess.run([sys.executable, "-c", SCRIPT, vendor, str(references)], capture_output=True,
                       text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    results = {x["program"]: x for x in json.loads(r.stdout)}
    assert set(results) == set(jax_zoo.ZOO)
    for name, x in results.items():
        assert x["error"] == "" and x["ok"], (name, x["error"], x["errors"])
        assert x["fallbacks"] == [] and x["counts"]["executions"] >= 1 and x["routes"]["native"] > 0
    assert results["gru-scan"]["routes"]["control"] >= 2          # the scan's while loops, host-driven
    assert results["gru-scan"]["counts"]["host_loop_iterations"] >= 30
    assert results["adamw-cosine"]["counts"]["executions"] >= 4   # one jitted step per call


def test_the_pjrt_route_needs_the_plugin_registered():
    from fornax.layers.errors import ConfigError
    with pytest.raises(ConfigError, match="PJRT plugin is not registered in this process"):
        jax_zoo.run_program("cnn", "cuda-like", route="pjrt")
    with pytest.raises(ConfigError, match="unknown jax zoo route 'xla'"):
        jax_zoo.run_program("cnn", "cuda-like", route="xla")
