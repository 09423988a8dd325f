"""Which sequences run in the next step, and how many tokens each: :class:`Scheduler`.

Continuous batching (the policy of vLLM's scheduler)
----------------------------------------------------
Every step is one forward pass over a batch of *items*: a sequence and how many new tokens
it computes, from its ``num_computed`` on.  A decode computes 1 token; a prefill computes a
chunk of its prompt.  Sequences join and leave the batch at step granularity, so a finished
request's slot is reused at once instead of waiting for the whole batch.  Two limits bound a
step: ``max_batched_tokens`` (the token budget, prefill chunks and decodes together) and
``max_num_seqs`` (running sequences).

:meth:`Scheduler.schedule` builds a step in three phases, in priority order:

1. **Running sequences**, in order (oldest admission first).  Each gets
   ``min(tokens left to compute, budget left)`` tokens: 1 for a decode, the next chunk for a
   prefill in progress (chunked prefill).  Decodes therefore go before any new prefill, and a
   long prompt cannot stall the decodes of the others.  When the block pool cannot hold a
   sequence's new tokens, the *last* running sequence (the lowest priority, the most recently
   admitted) is preempted and the allocation retried; if the sequence itself is the last one
   left it is preempted too.  Preemption is either

   * ``"recompute"`` — its blocks are freed and ``num_computed`` reset; it goes back to the
     *front* of the waiting queue and is prefilled again (prompt and generated tokens, so
     generation continues where it stopped; the prefix cache usually finds much of it), or
   * ``"swap"`` — its blocks are copied to host swap space (the step's ``swap_out`` list,
     done before the step runs) and it joins the swapped queue with its K/V intact; when the
     host has no room it is recomputed instead.

2. **Swapped sequences**, only if nothing was preempted in this step (a preemption means
   there is no room): in order, each is swapped back in (``swap_in`` copies) when the pool has
   blocks for its table and its next tokens, and is scheduled for them.

3. **Waiting sequences**, only if nothing was preempted in this step and no sequence is
   still swapped out (those were running before and come first): first come, first served,
   while the budget, ``max_num_seqs`` and the pool allow.  A sequence's cached prefix is
   matched first (:meth:`~fornax.serving.blocks.BlockManager.match_prefix`), then its first
   chunk is allocated.  Admission stops at the first sequence that does not fit — without
   chunked prefill its whole remaining prompt must fit the budget — so a large request is not
   overtaken by smaller ones forever.

Requests that can never run are configuration errors, raised by :meth:`Scheduler.schedule`
after they join the waiting queue and before the step changes anything: one whose longest
length (prompt plus every generated token but the last) needs more blocks than the cache
has, or — without chunked prefill — one that must compute more tokens in one step than the
budget allows.

:meth:`Scheduler.finish_step` applies a step's results: every item's tokens become computed,
newly full blocks are registered in the prefix cache, and the items that reached the end of
their tokens get their sampled token.  A sequence that generated ``max_new_tokens`` finishes
and releases its blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fornax.layers.errors import ConfigError
from fornax.serving.blocks import BlockManager
from fornax.serving.requests import Request
from fornax.serving.sequence import Sequence

#: the preemption modes
PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SchedulerConfig:
    """The batching limits and policies of a :class:`Scheduler`."""

    max_num_seqs: int = 16
    max_batched_tokens: int = 256
    chunked_prefill: bool = True
    preemption: str = "recompute"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"scheduler: {name} must be an integer >= 1, not {value!r}",
                                  hint="the batch needs room for at least one sequence and one token")
        if not isinstance(self.chunked_prefill, bool):
            raise ConfigError(f"scheduler: chunked_prefill must be true or false, not "
                              f"{self.chunked_prefill!r}", hint="chunked prefill is on by default")
        if self.preemption not in PREEMPTION_MODES:
            raise ConfigError(f"scheduler: preemption must be one of {', '.join(PREEMPTION_MODES)}, "
                              f"not {self.preemption!r}",
                              hint="recompute drops a preempted sequence's K/V; swap copies them to host memory")


@dataclass
class Step:
    """One scheduled forward pass.

    ``items`` are the scheduled sequences with the number of NEW tokens each computes, from
    its ``num_computed`` on; ``swap_out`` are (device block, host block) copies to make before
    the step and ``swap_in`` (host block, device block) copies to make after those and before
    the step; ``preempted`` are the sequences preempted while building it."""

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @staticmethod
    def samples(seq: Sequence, n: int) -> bool:
        """Whether the item (``seq``, ``n``) produces a token: it computes up to the last of the
        sequence's tokens.  Asked before :meth:`Scheduler.finish_step` advances the sequence."""
        return seq.num_computed + n == seq.num_tokens

    @staticmethod
    def is_decode(seq: Sequence, n: int) -> bool:
        """Whether the item (``seq``, ``n``) is a decode: it computes exactly the token sampled
        last (everything before it already computed).  Every other item is prefill work,
        the recomputation of a preempted sequence included."""
        return n == 1 and seq.num_computed == seq.num_tokens - 1 and seq.num_computed >= seq.prompt_len

    @property
    def num_tokens(self) -> int:
        """Tokens computed by the step."""
        return sum(n for _, n in self.items)

    @property
    def num_seqs(self) -> int:
        return len(self.items)


class Scheduler:
    """Continuous batching with chunked prefill and preemption over a :class:`BlockManager`.

    ``waiting``, ``running`` and ``swapped`` hold the unfinished sequences in priority order
    (the head first)."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager):
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self._ids: set[str] = set()
        #: sequences (re)entering the waiting queue, checked at the next schedule()
        self._unchecked: list[Sequence] = []
        self._steps = 0
        self._preemptions = 0
        self._swaps = 0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._prefix_hit_tokens = 0

    def add(self, request: Request) -> Sequence:
        """A new sequence for ``request``, at the back of the waiting queue."""
        if request.id in self._ids:
            raise ConfigError(f"request id {request.id!r} was already added",
                              hint="every request of a trace needs its own id")
        self._ids.add(request.id)
        seq = Sequence(request)
        seq.status = "waiting"
        self.waiting.append(seq)
        self._unchecked.append(seq)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ---- schedule ----------------------------------------------------------------------

    def schedule(self) -> Step:
        """The next step (see the module's docstring for the policy)."""
        self._check_feasible()
        step = Step()
        budget = self.config.max_batched_tokens
        budget = self._schedule_running(step, budget)
        if not step.preempted:
            budget = self._schedule_swapped(step, budget)
            if not self.swapped:
                self._schedule_waiting(step, budget)
        if step.items:
            self._steps += 1
        for seq, n in step.items:
            if step.is_decode(seq, n):
                self._decode_tokens += n
            else:
                self._prefill_tokens += n
        return step

    def _check_feasible(self) -> None:
        blocks = self.blocks
        for seq in self._unchecked:
            need = blocks.blocks_for(seq.max_len)
            if need > blocks.num_blocks:
                raise ConfigError(
                    f"request {seq.id} can never fit the KV cache: {seq.prompt_len} prompt tokens "
                    f"+ {seq.request.max_new_tokens} to generate = {seq.max_len} tokens of K/V, "
                    f"{need} blocks of {blocks.block_size}, but the cache holds {blocks.num_blocks} "
                    f"blocks ({blocks.num_blocks * blocks.block_size} tokens)",
                    hint="give the KV cache more blocks, or send shorter requests "
                         "(fewer prompt tokens or a smaller max_new_tokens)")
            if not self.config.chunked_prefill and seq.num_tokens > self.config.max_batched_tokens:
                again = " (preempted: its prompt and generated tokens are recomputed)" \
                    if seq.num_generated else ""
                raise ConfigError(
                    f"request {seq.id} must prefill {seq.num_tokens} tokens in one step{again}, "
                    f"but max_batched_tokens is {self.config.max_batched_tokens} and chunked "
                    f"prefill is off",
                    hint="turn chunked prefill on, raise max_batched_tokens, or preempt by swapping")
        self._unchecked.clear()

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens a sequence with ``remaining`` tokens to compute gets from ``budget`` (0:
        it does not fit this step)."""
        if self.config.chunked_prefill:
            return min(remaining, budget)
        return remaining if remaining <= budget else 0

    def _schedule_running(self, step: Step, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            n = self._chunk(seq.num_tokens - seq.num_computed, budget)
            if n == 0:
                break
            while not self.blocks.allocate(seq, n):
                victim = self.running.pop()
                self._preempt(victim, step)
                if victim is seq:
                    break
            else:
                step.items.append((seq, n))
                budget -= n
                index += 1
        return budget

    def _preempt(self, seq: Sequence, step: Step) -> None:
        seq.preemptions += 1
        step.preempted.append(seq)
        if self.config.preemption == "swap":
            pairs = self.blocks.swap_out(seq)
            if pairs is not None:
                step.swap_out.extend(pairs)
                seq.status = "swapped"
                self.swapped.append(seq)
                self._swaps += 1
                return
        self.blocks.free(seq)
        seq.num_computed = 0
        seq.status = "waiting"
        self.waiting.appendleft(seq)
        self._unchecked.append(seq)
        self._preemptions += 1

    def _schedule_swapped(self, step: Step, budget: int) -> int:
        while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            n = self._chunk(seq.num_tokens - seq.num_computed, budget)
            if n == 0:
                break
            table = len(seq.host_blocks)
            extra = max(0, self.blocks.blocks_for(seq.num_computed + n) - table)
            if table + extra > self.blocks.free_blocks:
                break
            self.swapped.popleft()
            pairs = self.blocks.swap_in(seq)
            if pairs is None or not self.blocks.allocate(seq, n):
                raise RuntimeError(f"swap-in of {seq.id} failed after its blocks were counted")
            step.swap_in.extend(pairs)
            seq.status = "running"
            self.running.append(seq)
            step.items.append((seq, n))
            budget -= n
        return budget

    def _schedule_waiting(self, step: Step, budget: int) -> None:
        blocks = self.blocks
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            fresh = seq.num_computed == 0 and not seq.block_table
            hits = blocks.lookup(seq) if fresh else []
            start = len(hits) * blocks.block_size if fresh else seq.num_computed
            n = self._chunk(seq.num_tokens - start, budget)
            if n == 0:
                break
            need = blocks.blocks_needed(seq, n, hits) if fresh else blocks.blocks_needed(seq, n)
            if need > blocks.free_blocks:
                break
            self.waiting.popleft()
            if fresh:
                hit = blocks.match_prefix(seq)
                self._prefix_hit_tokens += hit
            if not blocks.allocate(seq, n):
                raise RuntimeError(f"admission of {seq.id} failed after its blocks were counted")
            seq.status = "running"
            self.running.append(seq)
            step.items.append((seq, n))
            budget -= n

    # ---- results -----------------------------------------------------------------------

    def finish_step(self, step: Step, sampled: dict[str, int], now: float) -> list[Sequence]:
        """Apply a step that ran at simulated time ``now``: ``sampled`` maps the id of every
        item that samples (:meth:`Step.samples`) to its new token.  Returns the sequences that
        finished, now released."""
        finished = []
        for seq, n in step.items:
            samples = step.samples(seq, n)
            seq.num_computed += n
            self.blocks.commit(seq)
            if not samples:
                continue
            if seq.id not in sampled:
                raise KeyError(f"step result has no sampled token for {seq.id}")
            seq.tokens.append(int(sampled[seq.id]))
            seq.token_times.append(now)
            if seq.first_token_at is None:
                seq.first_token_at = now
            if seq.done:
                seq.status = "finished"
                seq.finished_at = now
                self.blocks.free(seq)
                self.running.remove(seq)
                finished.append(seq)
        return finished

    def counts(self) -> dict[str, int]:
        """``steps`` (non-empty steps scheduled), ``preemptions`` (by recompute), ``swaps``
        (preemptions by swapping out), ``prefill_tokens`` and ``decode_tokens`` (scheduled),
        ``prefix_hit_tokens`` (found in the prefix cache at admission)."""
        return {
            "steps": self._steps,
            "preemptions": self._preemptions,
            "swaps": self._swaps,
            "prefill_tokens": self._prefill_tokens,
            "decode_tokens": self._decode_tokens,
            "prefix_hit_tokens": self._prefix_hit_tokens,
        }


__all__ = ["PREEMPTION_MODES", "Scheduler", "SchedulerConfig", "Step"]
