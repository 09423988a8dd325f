"""Every fornax command once as a real process (``python -m fornax.cli``): a successful run
exits 0 and its --json document validates against the shipped schema.  (compare, qualify,
devices and specs have their own process tests in their modules.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fornax.schemas import validate


def fornax(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fornax.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args, kind", [
    (["compose", "--vendor", "xpu-like", "--spec", "tiny", "--json"], "report"),
    (["conform", "framework", "--vendor", "rocm-like", "--json"], "conform"),
    (["workloads", "--json"], "workloads"),
    (["cost", "gemm", "--m", "4096", "--n", "4096", "--k", "4096", "--json"], "cost"),
])
def test_json_commands_in_a_process(args, kind):
    p = fornax(*args)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == f"fornax.{kind}/1"
    validate(doc)


def test_compose_and_compile_human_output_in_a_process():
    p = fornax("compose", "--vendor", "cuda-like", "--spec", "tiny")
    assert p.returncode == 0 and p.stderr == ""
    assert "fornax stack" in p.stdout and "simulated device time" in p.stdout
    p = fornax("compile", "--workload", "mlp", "--vendor", "rocm-like", "--emit", "graph")
    assert p.returncode == 0 and p.stdout.startswith("graph mlp(")


@pytest.mark.parametrize("after_s", [3.0, 6.0])
def test_ctrl_c_ends_a_command_with_rc_130_and_one_line_jax_loaded_or_not(after_s):
    """qualify imports JAX, whose garbage-collector callback used to swallow the interrupt
    (the command ran on to exit 0); now it ends, at once, with one line."""
    import signal
    import time
    # a suite started as a background job inherits SIGINT ignored (POSIX shells do that for
    # `cmd &`), and so would the command: it starts with Python's own SIGINT handler, as
    # from an interactive shell (set in the child: a fork hook would warn in a JAX process)
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv = ['fornax', 'qualify', '--vendor', 'cuda-like']; "
             "runpy.run_module('fornax.cli', run_name='__main__', alter_sys=True)")
    p = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", start],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    assert p.poll() is None, "qualify finished before the interrupt"
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)           # faulthandler prints every thread's stack
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        raise AssertionError(f"the interrupted command did not end; its threads:\n{err[-6000:]}") from None
    assert p.returncode == 130 and err.strip().splitlines() == ["fornax: error: interrupted"], err
