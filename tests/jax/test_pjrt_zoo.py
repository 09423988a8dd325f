"""The project's JAX zoo (equinox CNN, attention block, GRU over lax.scan, optax training
loops) through plain ``jax.jit`` on the fornax PJRT platform, on every family, each family
in a fresh process (one plugin per process), against ``jax.jit`` on the CPU.

One process computes the CPU references once; it and the family processes share a JAX
persistent compilation cache, so the small CPU programs that build the models are compiled
once for all of them (the fornax platform's own programs are never cached: the plugin does
not serialize executables)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fornax.frameworks.jax.plugin import without_switches
from fornax.scenarios import jax_zoo

ROOT = Path(__file__).resolve().parents[2]
REFERENCES = """
import pickle, sys
from fornax.scenarios import jax_zoo
with open(sys.argv[1], "wb") as f:
    pickle.dump({n: jax_zoo._reference(n, 0) for n in jax_zoo.ZOO}, f)
"""
FAMILY = """
import json, pickle, sys, warnings
warnings.simplefilter("ignore")       # the cache's note that fornax executables are not serialized
from fornax.scenarios import jax_zoo
with open(sys.argv[2], "rb") as f:
    refs = pickle.load(f)
jax_zoo._reference = lambda name, seed: refs[name]
print(json.dumps([jax_zoo.run_program(n, sys.argv[1], route="pjrt").to_json() for n in jax_zoo.ZOO]))
"""


def _env(cache: Path, **extra) -> dict:
    env = without_switches()
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", **extra)
    return env


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("zoo")
    refs, cache = tmp / "references.pkl", tmp / "jax-cache"
    r = subprocess.run([sys.executable, "-c", REFERENCES, str(refs)], capture_output=True, text=True,
                       timeout=900, env=_env(cache), cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return refs, cache


@pytest.mark.parametrize("vendor", jax_zoo.FAMILIES)
def test_the_zoo_through_plain_jax_jit_on_the_plugin_matches_the_cpu(vendor, references):
    refs, cache = references
    r = subprocess.run([sys.executable, "-c", FAMILY, vendor, str(refs)], capture_output=True,
                       text=True, timeout=900, env=_env(cache, FORNAX_PJRT=vendor), cwd=ROOT)
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
