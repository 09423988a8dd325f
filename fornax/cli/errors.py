"""How every ``fornax`` command ends on an error: one line on stderr and an exit code — 2 for
a usage or configuration mistake, 1 for a failure while running, 130 when interrupted —
and the traceback only with ``--debug``."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading

import click

from .. import heap
from ..layers.errors import ConfigError, FornaxError
from ..sim.faults import SimError, SpecError


def _fail(message: str, code: int) -> None:
    click.echo(f"fornax: error: {' '.join(str(message).split())}", err=True)
    if code == 130 and _installed.is_set():
        _interrupted()
    sys.exit(code)


# -- Ctrl-C -------------------------------------------------------------------------------------
#: seconds before an interrupt that was swallowed is delivered again
REDELIVER_S = 0.5
_acknowledged = threading.Event()
_installed = threading.Event()          # the command line's handler (not under a test runner)


def _interrupted() -> None:
    """End an interrupted command now, with rc 130: nothing a simulated device holds needs
    releasing (it is this process's memory), so exit-time clean-up never waits on it."""
    _acknowledged.set()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


def _on_sigint(signum, frame) -> None:
    """Raise KeyboardInterrupt where the main thread is, and deliver the signal again shortly
    in case that was a place that swallows exceptions (a garbage-collector callback such
    as JAX's, a finaliser: "Exception ignored in ..."), until a command acknowledges it."""
    def again():
        if not _acknowledged.is_set():
            os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Timer(REDELIVER_S, again)
    timer.daemon = True
    timer.start()
    if not _swallowing(frame):       # else the next delivery raises (no "Exception ignored" noise)
        raise KeyboardInterrupt


def _swallowing(frame) -> bool:
    """Whether ``frame`` runs inside code whose exceptions Python ignores: a garbage-collector
    callback, a weakref finaliser or a ``__del__``."""
    import gc
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or \
                (code.co_name == "__call__" and code.co_filename.endswith("weakref.py")):
            return True
        frame = frame.f_back
    return False


def install_interrupt_handler() -> None:
    """Ctrl-C ends every fornax command with one line and rc 130, JAX loaded or not."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        _installed.set()


def handle_errors(fn):
    """Turn fornax errors into one line and an exit code (no traceback unless --debug)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debug = kwargs.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except (FornaxError, SimError) as exc:
            if debug:
                raise
            _fail(str(exc), 2 if isinstance(exc, (ConfigError, SpecError)) else 1)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
    return wrapper


debug_option = click.option("--debug", is_flag=True, help="Show tracebacks for errors.")


class FornaxGroup(click.Group):
    """The ``fornax`` command group: click's own usage errors (an unknown command or option,
    a missing or malformed value) end like every other fornax error, in one line and exit
    code 2, whichever subcommand they come from."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        if args is None:                # the command line itself (a test runner passes args)
            install_interrupt_handler()
            heap.arm()                  # the process is ours: freeze its heap at the first stack
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else self.name
            _fail(f"{exc.format_message().rstrip('.')} (see {where} --help)", 2)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("interrupted", 130)
        sys.exit(rv if isinstance(rv, int) else 0)
