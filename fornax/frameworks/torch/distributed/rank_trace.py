"""Each rank's Perfetto trace, ready for ``fornax trace merge``.

A rank's trace is its device's simulated timeline (:func:`fornax.sim.trace.chrome_trace`)
with ``otherData`` saying whose it is: the global rank, the world size, the family, the
node and the backend.  The collectives on it carry their group, sequence number, this
rank's arrival, the latest arrival and the rank that arrived last, so merging the ranks'
files lines the same collective up across them and shows who kept the others waiting.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ....sim.trace import chrome_trace
from .. import session as _session
from .process_group import BACKEND, ProcessGroupFornax


def rank_trace(group: ProcessGroupFornax | None = None) -> dict[str, Any]:
    """This process's trace: its fornax device's timeline, labelled with its rank."""
    session = _session.current()
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    per = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    trace = chrome_trace([session.runtime.context().device])
    trace["otherData"].update({"rank": rank, "world_size": world, "node": rank // per,
                               "family": session.framework.vendor, "backend": BACKEND})
    if group is not None:
        trace["otherData"]["group"] = group.report()
    return trace


def write_rank_trace(folder: str | os.PathLike, group: ProcessGroupFornax | None = None) -> Path:
    """Write :func:`rank_trace` to ``folder/rank<R>.trace.json``; its path."""
    trace = rank_trace(group)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{trace['otherData']['rank']}.trace.json"
    path.write_text(json.dumps(trace), encoding="utf-8")
    return path
