"""Driver modules: loading a kernel binary by its format's load rule, fat bundles,
unloading, and the build log.

A family's ``[driver.formats]`` give each format a rule: ``exact`` (an object
for one arch: a mismatch is no binary for the device), ``virtual`` (a virtual
ISA JIT-compiled for the device's generation or newer), ``il`` (an IL
finalised at load: build cost and build failures) or ``bundle`` (a fat binary:
the exact image for the device, else the newest virtual one it can JIT).
"""

from __future__ import annotations

import re

from ...sim.faults import InvalidProgram
from ...sim.isa import Program
from ...sim.verify import IllTypedProgram, check_module
from ..binary import ContainerError, KernelBinary
from .context import ContextRules
from .core import handles
from .protocol import Context, Module


def arch_number(target: str) -> int | None:
    """The numeric generation in an arch name (``sm_90`` -> 90, ``compute_80`` -> 80)."""
    m = re.search(r"(\d+)$", target)
    return int(m.group(1)) if m else None


class ModuleLoader(ContextRules):
    """Module loading by format rule; a vendor supplies :meth:`decode_image` (and
    :meth:`unbundle` for a bundle format)."""

    # -- vendor hooks -----------------------------------------------------
    def decode_image(self, binary: KernelBinary) -> dict[str, Program]:
        """Parse the family's container into kernels; raise ContainerError or InvalidProgram."""
        raise NotImplementedError

    def unbundle(self, binary: KernelBinary) -> list[KernelBinary]:
        """Vendor hook for ``bundle`` formats: the images a fat bundle holds."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------
    def load_module(self, ctx: Context | None, binary: KernelBinary) -> Module:
        ctx = self.resolve_context(ctx, "load_module")
        self.check(ctx, "load_module")
        if not isinstance(binary, KernelBinary):
            raise self.fail("invalid_value", f"expected a KernelBinary, got {type(binary).__name__}",
                            call="load_module")
        rule = self.formats.get(binary.format)
        if rule is None:
            raise self.fail("unsupported_format",
                            f"cannot load a {binary.format} image; this driver loads "
                            f"{', '.join(self.formats)}", call="load_module",
                            hint="compose a compiler/library whose formats this driver loads")
        index = self.devices.index(ctx.device)
        device_target = self.target(index)
        if rule["rule"] == "bundle":
            return self._load_bundle(ctx, binary, device_target)
        how, cost = "loaded", 0.0
        if rule["rule"] == "exact" and binary.target != device_target:
            raise self.fail("no_binary_for_device",
                            f"{binary.format} image is built for {binary.target}, the device is "
                            f"{device_target}", call="load_module",
                            hint=f"rebuild for {device_target}")
        if rule["rule"] == "virtual":
            have, need = arch_number(device_target), arch_number(binary.target)
            if have is None or need is None or need > have:
                raise self.fail("no_binary_for_device",
                                f"{binary.format} for {binary.target} needs a device of that "
                                f"generation or newer; the device is {device_target}",
                                call="load_module")
            how = "jit"
        elif rule["rule"] == "il":
            how = "built"
        if how != "loaded":
            cost = rule.get("build_s_per_kib", 0.0) * len(binary.data) / 1024 + rule.get("build_s", 0.0)
            self.counts["jit_compiles" if how == "jit" else "il_builds"] += 1
            self.module_load_s += cost         # a build that fails has still taken its time
        try:
            kernels = check_module(self.decode_image(binary))    # ill-typed tiles: a build error
        except (ContainerError, InvalidProgram, UnicodeDecodeError) as exc:
            condition = "build_failure" if how in ("jit", "built") else "corrupt_image"
            log = f"{binary.format} build for {device_target} failed: {exc}"
            self.last_build_log = log if how != "loaded" or isinstance(exc, IllTypedProgram) else ""
            err = self.fail(condition, f"{binary.format} image rejected: {exc}", call="load_module",
                            hint="read the error's build_log" if self.last_build_log else
                            "the binary is corrupt or was not produced for this format")
            err.build_log = self.last_build_log
            raise err from None
        self.last_build_log = ""
        self.counts["modules_loaded"] += 1
        module = Module(next(handles), ctx, binary, kernels, cost, how)
        self.modules[module.handle] = module
        return module

    def unload_module(self, module: Module) -> None:
        """Unload a module (``[driver.calls] unload_module``): its kernels can no longer be
        launched; work already submitted still runs."""
        if not isinstance(module, Module) or not module.loaded:
            raise self.fail("invalid_handle", "the module was already unloaded or is not a module",
                            call="unload_module")
        if not module.context.live:
            raise self.fail("invalid_context", "the module's context was destroyed",
                            call="unload_module")
        module.loaded = False
        self.modules.pop(module.handle, None)

    def build_log(self) -> str:
        """The log of the last JIT / IL build (zeModuleBuildLogGetString-like); empty if it passed."""
        return self.last_build_log

    def _load_bundle(self, ctx: Context, binary: KernelBinary, device_target: str) -> Module:
        """A fat bundle: the exact image for the device if there is one, else the newest
        virtual image the device can JIT, else no binary for the device."""
        try:
            entries = self.unbundle(binary)
        except (ContainerError, UnicodeDecodeError, ValueError) as exc:
            raise self.fail("corrupt_image", f"{binary.format} image rejected: {exc}",
                            call="load_module", hint="the bundle is corrupt") from None

        def rule_of(e: KernelBinary) -> str | None:
            rule: str | None = self.formats.get(e.format, {}).get("rule")
            return rule

        def generation(e: KernelBinary) -> int:
            return arch_number(e.target) or 0     # only called on images that have one

        have = arch_number(device_target)
        exact = [e for e in entries if rule_of(e) == "exact" and e.target == device_target]
        virtual = sorted((e for e in entries if rule_of(e) == "virtual" and have is not None
                          and (n := arch_number(e.target)) is not None and n <= have),
                         key=generation)
        chosen = exact[0] if exact else (virtual[-1] if virtual else None)
        if chosen is None:
            held = ", ".join(f"{e.format}:{e.target}" for e in entries) or "nothing"
            raise self.fail("no_binary_for_device", f"{binary.format} bundle holds {held}; none runs "
                            f"on {device_target}", call="load_module",
                            hint=f"rebuild the bundle with an image for {device_target} or an older "
                                 "virtual arch")
        module = self.load_module(ctx, chosen)
        module.binary, module.entry = binary, f"{chosen.format}:{chosen.target}"
        return module
