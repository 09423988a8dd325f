"""The command line freezes its process heap at the first composed stack; a library user's
process is left alone (fornax/heap.py)."""

import gc
import subprocess
import sys

from fornax import heap
from fornax.stack import compose, make_config


def test_a_library_compose_leaves_the_heap_alone():
    before = gc.get_freeze_count()
    compose(make_config("cuda-like", spec="tiny"))
    assert gc.get_freeze_count() <= before          # frozen objects that die leave the count


def test_an_armed_compose_freezes_once():
    heap.arm()
    keep = [object() for _ in range(10)]      # noqa: F841  (alive at the freeze)
    before = gc.get_freeze_count()
    compose(make_config("rocm-like", spec="tiny"))
    frozen = gc.get_freeze_count()
    assert frozen > before
    compose(make_config("rocm-like", spec="tiny"))          # disarmed after the first
    assert gc.get_freeze_count() <= frozen


def test_the_command_line_arms_it():
    code = ("import gc, sys; from fornax.cli.main import main; "
            "sys.argv = ['fornax', 'compose', '--vendor', 'cuda-like', '--spec', 'tiny', '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print('frozen', gc.get_freeze_count(), file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stderr.split("frozen")[-1]) > 10_000          # the simulator, numpy, click, rich
