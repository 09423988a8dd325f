"""L0, device discovered: the driver enumerates and describes the devices; PyTorch
(``torch.fornax``) and JAX see them in the family's vocabulary; the installed package
registers the device on ``import torch``."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from .. import qualify_clients as plumbing
from ..contracts.clause import Outcome
from .levels import evidence
from .subject import StackSubject, torch_fornax


@evidence("L0", "driver", "the driver enumerates the devices and describes them", seam="driver",
          measured="devices enumerated", relation="==", limit="the config's device count")
def _l0_driver(s: StackSubject) -> Outcome:
    stack = s.stack
    drv = stack.driver
    n = drv.device_count()
    props = [drv.properties(i) for i in range(n)]
    problems = []
    # a partitioned chip's partitions are the devices (fornax.sim.partition)
    want = len(stack.layout.partitions) if stack.layout is not None else stack.config.devices
    if n != want:
        problems.append(f"{n} devices enumerated, the config composed {want}")
    for p in props:
        if not p.name or not p.target:
            problems.append(f"device {p.index} has no name or arch target")
        have = stack.devices[p.index].spec.hbm_bytes if p.index < len(stack.devices) else stack.spec.hbm_bytes
        if p.memory_bytes != have:
            problems.append(f"device {p.index} reports {p.memory_bytes} bytes of memory, the "
                            f"{'partition' if stack.layout is not None else 'chip'} has {have}")
        if not p.native:
            problems.append(f"device {p.index} has no properties in the family's vocabulary")
    first = props[0] if props else None
    desc = (f"{first.name}: {first.target}, {first.compute_units} units, SIMD {first.simd_width}, "
            f"{first.memory_bytes / 2**30:.1f} GiB; native: {', '.join(sorted(first.native)[:4])}"
            if first else "no device")
    return Outcome(n, not problems and n > 0, "; ".join(problems) or desc)


@evidence("L0", "torch", "torch.fornax is_available / device_count / get_device_properties in "
          "the family's vocabulary", seam="framework", measured="face property fields present",
          relation="==", limit="every field of the family's face")
def _l0_torch(s: StackSubject) -> Outcome:
    session = s.torch()
    fw = session.framework
    face = fw.face
    props = torch_fornax().get_device_properties()
    drv = s.stack.driver.properties(0)
    want = [name for name, _ in fw.torch_face.properties]
    have = [name for name in want if hasattr(props, name)]
    problems = []
    if not torch_fornax().is_available():
        problems.append("torch.fornax.is_available() is False")
    if torch_fornax().device_count() != 1:
        problems.append(f"torch.fornax.device_count() is {torch_fornax().device_count()}, not 1")
    if len(have) != len(want):
        problems.append(f"missing property fields: {', '.join(n for n in want if n not in have)}")
    seam_says = fw.device_properties(s.stack.driver, 0)
    differ = [k for k, v in seam_says.items() if getattr(props, k, None) != v]
    if differ:
        problems.append(f"fields differ from the framework seam's answer: {', '.join(differ)}")
    if not getattr(props, "name", None):
        problems.append("the device has no name")
    if "total_memory" in want and getattr(props, "total_memory", None) != drv.memory_bytes:
        problems.append(f"total_memory {getattr(props, 'total_memory', None)} is not the driver's "
                        f"{drv.memory_bytes}")
    version = getattr(torch_fornax().version, face.version_field, None)
    if version != face.version:
        problems.append(f"torch.fornax.version.{face.version_field} is {version!r}, the face says "
                        f"{face.version!r}")
    detail = (f"{face.module} face, device type {face.device_type!r}, {props.name}; "
              f"version.{face.version_field} = {version}; {len(have)} property fields")
    return Outcome(f"{len(have)}/{len(want)}", not problems, "; ".join(problems) or detail)


@evidence("L0", "jax", "the JAX client lists the devices on the family's platform", seam="framework",
          measured="client devices", relation="==", limit="the driver's device count")
def _l0_jax(s: StackSubject) -> Outcome:
    from ..frameworks.jax import resolve
    client = resolve(s.stack)
    devs = client.devices()
    drv = s.stack.driver
    face = s.stack.framework.face
    problems = []
    if len(devs) != drv.device_count():
        problems.append(f"{len(devs)} client devices, the driver enumerates {drv.device_count()}")
    for d in devs:
        if d.device_kind != drv.properties(d.id).name:
            problems.append(f"device {d.id} kind {d.device_kind!r} is not the driver's name")
    if client.platform != face.pjrt_platform:
        problems.append(f"platform {client.platform!r} is not the face's {face.pjrt_platform!r}")
    detail = (f"platform {client.platform!r} (plugin {client.plugin}, {client.platform_version}); "
              f"{', '.join(repr(d) for d in devs)}: {devs[0].device_kind if devs else '-'}")
    return Outcome(len(devs), not problems and bool(devs), "; ".join(problems) or detail)


@evidence("L0", "packaging", "the installed package autoloads: a fresh interpreter's `import torch` "
          "registers the fornax device (TORCH_DEVICE_BACKEND_AUTOLOAD=0 opts out)", seam="framework",
          measured="fresh interpreters that see the device as they should", relation="==",
          limit="all (2; 3 with --full: a fresh venv installed from the source tree)")
def _l0_packaging(s: StackSubject) -> Outcome:
    problems, seen = [], []
    ep = plumbing.entry_point()
    if ep != "fornax.frameworks.torch.autoload:autoload":
        problems.append(f"the installed distribution's torch.backends entry point is {ep!r}")
    code, out = plumbing.probe(sys.executable, plumbing.clean_env())
    if code or not out.startswith("fornax fornax:0"):
        problems.append(f"`import torch` in a fresh interpreter: {out or f'exit {code}'}")
    else:
        seen.append("import torch registers fornax")
    code, out = plumbing.probe(sys.executable, plumbing.clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    if code or not out.startswith("privateuseone -"):
        problems.append(f"with TORCH_DEVICE_BACKEND_AUTOLOAD=0 the device still loads: {out or code}")
    else:
        seen.append("TORCH_DEVICE_BACKEND_AUTOLOAD=0 opts out")
    runs = 2
    if s.full:
        runs = 3
        root = plumbing.source_root()
        if root is None:
            problems.append("--full installs fornax from its source tree; this fornax was "
                            "installed from a wheel, so there is none to install from")
        else:
            with tempfile.TemporaryDirectory(prefix="fornax-venv-") as tmp:
                python = plumbing.fresh_venv_install(root, Path(tmp))
                code, out = plumbing.probe(python, plumbing.clean_env())
                if code or not out.startswith("fornax fornax:0"):
                    problems.append(f"in a fresh venv with fornax installed: {out or f'exit {code}'}")
                else:
                    seen.append("a fresh venv installs it and import torch registers fornax")
    good = runs - len(problems) if ep == "fornax.frameworks.torch.autoload:autoload" else 0
    return Outcome(max(good, 0), not problems, "; ".join(problems) or
                   f"entry point {ep}; " + "; ".join(seen))
