"""How every ``fornax`` command ends on an error: one line on stderr and an exit code — 2 for
a usage or configuration mistake, 1 for a failure while running, 130 when interrupted —
and the traceback only with ``--debug``."""

from __future__ import annotations

import functools
import sys

import click

from ..layers.errors import ConfigError, FornaxError
from ..sim.faults import SimError, SpecError


def _fail(message: str, code: int) -> None:
    click.echo(f"fornax: error: {' '.join(str(message).split())}", err=True)
    sys.exit(code)


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
