"""The serving engine: requests arrive on a simulated clock, the scheduler builds a step,
the model runner runs it on the device, and the clock advances by the step's simulated
device time.

The clock is simulated time, never host wall time.  A step starts when the previous one
ended (or, when nothing is waiting, at the next arrival); it lasts the device time its
kernels and copies took on the stack's timeline (:attr:`~fornax.sim.timeline.Timeline.busy_time`
before and after, the device synchronised at both ends).  The host's own work between
steps (scheduling, building the batch) is not on the clock: the figures are those of a
host that keeps the device fed.  Arrivals are admitted at the start of each step.

The result holds every sequence with its token times, and a sample per step (clock,
tokens, sequences, KV-block utilisation), from which :mod:`.metrics` computes the report.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from ..frameworks.torch import session as _session
from ..layers.errors import ConfigError, FornaxError
from ..sim.spec import ChipSpec
from .blocks import BlockManager
from .graph_model import GraphPagedModel
from .models import build
from .requests import Request
from .runner import PagedModel
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence


@dataclass(frozen=True)
class ServeConfig:
    """What ``fornax serve`` runs: the model, the KV cache and the scheduler's limits."""

    model: str = "llama"
    #: how the model runs: "torch" (its transformers modules, op by op on torch.device("fornax"))
    #: or "graph" (fornax's own graph decoder: whole graphs compiled by the stack)
    decoder: str = "torch"
    num_blocks: int = 128          # device KV blocks
    block_size: int = 16           # tokens per block
    host_blocks: int = 64          # swap space, in blocks
    prefix_caching: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"serve: {name} must be a positive integer, got {v!r}")
        if self.decoder not in ("torch", "graph"):
            raise ConfigError(f"serve: decoder must be torch or graph, got {self.decoder!r}")
        if not isinstance(self.host_blocks, int) or self.host_blocks < 0:
            raise ConfigError(f"serve: host_blocks must be 0 or more, got {self.host_blocks!r}")


@dataclass
class StepSample:
    """One engine step, as the report's time series shows it."""

    start: float                   # simulated seconds
    end: float
    prefill_tokens: int
    decode_tokens: int
    sequences: int
    kv_utilisation: float          # device blocks held by sequences / all blocks, after the step
    preempted: int


@dataclass
class ServeResult:
    """Everything a serving run measured."""

    config: ServeConfig
    vendor: str
    sequences: list[Sequence]
    steps: list[StepSample]
    makespan: float                # simulated seconds from the first arrival to the last token
    device_time: float             # simulated device time of the steps
    host_wall_s: float
    scheduler_counts: dict[str, int]
    block_counts: dict[str, int]
    cache_bytes: int
    model_shape: dict[str, Any]
    chip: ChipSpec                 # the device's spec (the capacity model reads its HBM)

    @property
    def spec(self) -> str:
        """The chip spec's name."""
        return self.chip.name

    def outputs(self) -> dict[str, list[int]]:
        """Every request's generated tokens, by id."""
        return {s.id: list(s.generated) for s in self.sequences}


class Engine:
    """A model, its paged cache and a scheduler, on the active fornax torch session."""

    def __init__(self, config: ServeConfig | None = None):
        self.config = config or ServeConfig()
        cfg = self.config
        self.session = _session.current()
        runner = GraphPagedModel if cfg.decoder == "graph" else PagedModel
        self.model = runner(build(cfg.model), cfg.num_blocks, cfg.block_size, cfg.host_blocks)
        self.blocks = BlockManager(cfg.num_blocks, cfg.block_size, cfg.prefix_caching, cfg.host_blocks)
        self.scheduler = Scheduler(cfg.scheduler, self.blocks)
        self.timeline = self.session.stack.devices[0].timeline

    def _device_now(self) -> float:
        torch.fornax.synchronize()        # type: ignore[attr-defined]   # (the device module)
        return float(self.timeline.busy_time)

    def run(self, requests: Seq[Request]) -> ServeResult:
        """Serve ``requests`` to completion."""
        t0 = time.perf_counter()
        vocab = self.model.shape.vocab
        limit = self.model.shape.max_positions
        for r in requests:
            if any(t < 0 or t >= vocab for t in r.prompt):
                raise ConfigError(f"request {r.id}: a prompt token is outside the model's vocabulary "
                                  f"[0, {vocab})", hint="draw tokens from the model's vocabulary")
            if len(r.prompt) + r.max_new_tokens > limit:
                raise ConfigError(f"request {r.id}: {len(r.prompt)} prompt + {r.max_new_tokens} new "
                                  f"tokens exceed the model's {limit} positions",
                                  hint="shorten the prompt or max_new_tokens")
        pending = collections.deque(sorted(requests, key=lambda r: r.arrival))
        if not pending:
            raise ConfigError("serve: no requests to serve", hint="give a trace with at least one request")
        seqs: list[Sequence] = []
        steps: list[StepSample] = []
        start = now = pending[0].arrival
        device_time = 0.0
        while pending or self.scheduler.has_unfinished():
            while pending and pending[0].arrival <= now:
                seqs.append(self.scheduler.add(pending.popleft()))
            if not self.scheduler.has_unfinished():
                now = pending[0].arrival
                continue
            step = self.scheduler.schedule()
            if not step.items and not step.swap_in and not step.swap_out:
                raise FornaxError("serve: the scheduler could schedule nothing although requests are "
                                  "waiting (the KV cache is held by sequences that cannot advance)",
                                  hint="give the cache more blocks (--num-blocks)")
            decode = sum(n for seq, n in step.items if step.is_decode(seq, n))
            prefill = step.num_tokens - decode
            before = self._device_now()
            sampled = self.model.execute(step)
            took = self._device_now() - before
            device_time += took
            began, now = now, now + took
            self.scheduler.finish_step(step, sampled, now)
            steps.append(StepSample(began, now, prefill, decode, len(step.items),
                                    self.blocks.utilisation(), len(step.preempted)))
        return ServeResult(
            config=self.config, vendor=self.session.stack.framework.vendor,
            sequences=seqs, steps=steps,
            makespan=now - start, device_time=device_time, host_wall_s=time.perf_counter() - t0,
            scheduler_counts=dict(self.scheduler.counts()), block_counts=dict(self.blocks.counts()),
            cache_bytes=self.model.cache_bytes, model_shape=vars(self.model.shape).copy(),
            chip=self.session.stack.spec)


def serve(requests: Seq[Request], config: ServeConfig | None = None) -> ServeResult:
    """Serve ``requests`` with ``config`` on the active fornax torch session
    (:func:`fornax.frameworks.torch.use_stack` picks the stack)."""
    return Engine(config).run(requests)
