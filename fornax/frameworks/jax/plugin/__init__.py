"""JAX at its real hardware boundary: a PJRT plugin written in Python.

JAX talks to hardware through PJRT, a C function table (``PJRT_Api``) a plugin hands it
in a ``PyCapsule``.  This package is such a table built from ctypes callbacks
(:mod:`.capi`, :mod:`.table`) over fornax's JAX client (:mod:`.api`): ``jax.devices("fornax")``
lists the stack's simulated devices, ``jax.device_put`` copies into simulated device
memory through the runtime seam, and ``jax.jit`` hands the plugin a whole StableHLO
program, which :mod:`.compile` translates into fornax's graph IR and compiles with the
stack's compiler seam.

**Opt-in.**  Installing fornax registers the ``jax_plugins`` entry point, whose
:func:`initialize` JAX calls at backend discovery; it registers the platform only when
asked, because every JAX process would otherwise compose a simulated stack at start-up
and carry a second platform:

* ``FORNAX_PJRT=rocm-like`` (a family; ``1`` means cuda-like) before JAX initialises its
  backends, or ``JAX_PLATFORMS`` naming ``fornax``;
* ``FORNAX_PJRT_CONFIG=stack.toml`` composes the client from a stack config instead,
  ``FORNAX_PJRT_DEVICES`` / ``FORNAX_PJRT_SPEC`` set the device count and chip;
* or, in Python, :func:`enable` before the first ``jax.devices()``.

The CPU stays JAX's default backend (the plugin registers below it), unless
``JAX_PLATFORMS=fornax`` makes fornax the only one.  A configuration that cannot be
composed is reported in one warning line and the plugin is not registered; a client that
fails to start is a quiet backend failure, so JAX on the CPU keeps working.

The platform is named ``fornax`` for every family.  A plugin's platform name selects
JAX's lowering rules: claiming ``cuda`` or ``rocm`` would make JAX emit that vendor's
library calls (cuDNN attention, cuSOLVER, GPU PRNG kernels) as custom calls in the
program.  The family face shows in each device's ``device_kind``, its attributes
(``family``, ``vendor_platform``, ``vendor_plugin``) and the client's ``platform_version``.
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ....layers.errors import ConfigError

log = logging.getLogger("fornax.jax.plugin")

PLATFORM = "fornax"
#: below the CPU's 0: registering the plugin never changes JAX's default device
PRIORITY = -100
_ON = {"1", "on", "true", "yes"}


@dataclass(frozen=True)
class Settings:
    """Which stack the plugin's client composes."""

    vendor: str = "cuda-like"
    spec: str | None = None
    devices: int | None = None
    config: str | None = None
    #: a StackConfig to compose as it is (``fornax compare`` hands its column's over)
    stack: Any = field(default=None, compare=False)

    def stack_config(self):
        from ....stack import load_config, make_config
        if self.stack is not None:
            return self.stack
        if self.config:
            return load_config(self.config)
        return make_config(self.vendor, spec=self.spec, devices=self.devices)

    def make_client(self):
        from ....stack import compose
        from ..pjrt import Client as FornaxClient
        from .objects import Client
        cfg = self.stack_config()
        fornax = FornaxClient(compose(cfg), f"PJRT plugin ({self.describe()})")
        return Client(fornax, cfg.seams["framework"], PLATFORM)

    def describe(self) -> str:
        return f"config {self.config}" if self.config else f"vendor {self.vendor}"


def settings_from_env(env=os.environ) -> Settings | None:
    """The settings the environment asks for, or None when it does not opt in."""
    want = env.get("FORNAX_PJRT", "").strip()
    platforms = [p.strip() for p in env.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    config = env.get("FORNAX_PJRT_CONFIG", "").strip() or None
    if not want and PLATFORM not in platforms and not config:
        return None
    if want.lower() in ("0", "off", "false", "no"):
        return None
    vendor = "cuda-like" if not want or want.lower() in _ON else want
    devices = env.get("FORNAX_PJRT_DEVICES", "").strip()
    if devices and not devices.isdigit():
        raise ConfigError(f"FORNAX_PJRT_DEVICES={devices!r} is not a device count", seam="framework",
                          hint="set a whole number, e.g. FORNAX_PJRT_DEVICES=2")
    return Settings(vendor=vendor, spec=env.get("FORNAX_PJRT_SPEC", "").strip() or None,
                    devices=int(devices) if devices else None, config=config)


_PLUGIN = None


def without_switches(env=os.environ) -> dict:
    """``env`` without the variables that turn the plugin on: what a child process gets that
    decides for itself (a jax-pjrt worker, a test's fresh process)."""
    return {k: v for k, v in env.items() if not k.startswith(("FORNAX_PJRT", "JAX_PLATFORMS"))}


def plugin():
    """The registered plugin (its table, handles and clients), or None."""
    return _PLUGIN


def registered():
    """The plugin registered in this process, with its client made (JAX discovers plugins, and
    the environment may opt in, at its first ``jax.devices()``); a ConfigError when there is none."""
    import jax
    jax.devices()
    if _PLUGIN is None or not _PLUGIN.clients:
        raise ConfigError("the fornax PJRT plugin is not registered in this process",
                          hint="set FORNAX_PJRT=<family> before starting Python, or call "
                               "fornax.frameworks.jax.plugin.enable() before JAX starts")
    return _PLUGIN


def register(settings: Settings) -> None:
    """Register the ``fornax`` platform with JAX (before its backends are initialised)."""
    global _PLUGIN
    from jax._src import xla_bridge as xb
    from jax._src.lib import xla_client
    if _PLUGIN is not None:
        raise ConfigError("the fornax PJRT plugin is already registered in this process", seam="framework",
                          hint="one plugin per process: choose the family before JAX starts")
    if xb._backends:
        raise ConfigError("JAX has already initialised its backends; the fornax platform must be "
                          "registered before the first jax.devices() / jax.jit call", seam="framework",
                          hint="call enable() first, or set FORNAX_PJRT before starting Python")
    settings.stack_config()               # a configuration that cannot be composed fails here, in Python
    from .api import Plugin
    p = Plugin(settings)
    capsule = p.table.capsule()
    xla_client.load_pjrt_plugin_with_c_api(PLATFORM, capsule)
    xb.register_backend_factory(PLATFORM, partial(xb.make_pjrt_c_api_client, PLATFORM), priority=PRIORITY,
                                fail_quietly=True, experimental=True,
                                make_topology=partial(xla_client.make_c_api_device_topology, capsule),
                                c_api=capsule)
    p.capsule = capsule
    atexit.register(p.table.close)
    _PLUGIN = p


def enable(vendor: str = "cuda-like", *, spec: str | None = None, devices: int | None = None,
           config: str | None = None) -> None:
    """Register the plugin for a stack of ``vendor`` (or a stack ``config``) from Python."""
    register(Settings(vendor=vendor, spec=spec, devices=devices, config=config))


def initialize() -> None:
    """The ``jax_plugins`` entry point: register when the environment opts in; on a bad
    configuration say why in one line and leave JAX as it is."""
    try:
        settings = settings_from_env()
        if settings is None or _PLUGIN is not None:
            return
        register(settings)
    except Exception as exc:         # never break JAX's start-up
        log.warning("fornax PJRT plugin not registered: %s", exc)
