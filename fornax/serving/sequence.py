"""One request's state in the engine: a :class:`Sequence`.

A sequence's ``tokens`` are its prompt followed by every token generated so far; they only
ever grow.  ``num_computed`` counts the leading tokens whose keys and values (K/V) sit in the
device KV cache: a step computes the next ``n`` tokens from ``num_computed`` on, and the step
that computes the last token of ``tokens`` samples one new token, which is appended.  So a
sequence in decode has ``num_computed == num_tokens - 1``: the token sampled last is computed
(its K/V written) by the next step, which samples the one after it.

The K/V of position ``p`` lives in device block ``block_table[p // block_size]`` (the
:class:`~fornax.serving.blocks.BlockManager` owns the blocks).  While swapped out the
sequence has no device blocks and ``host_blocks`` names its copies in host memory.

Statuses, as the :class:`~fornax.serving.scheduler.Scheduler` moves a sequence through them:

* ``"waiting"`` — queued for admission (new, or preempted by recompute: its K/V are dropped
  and ``num_computed`` is 0, but its generated tokens are kept and are prefilled again with
  the prompt);
* ``"running"`` — admitted, holding device blocks, scheduled every step the budget allows;
* ``"swapped"`` — preempted by swapping, its K/V in host blocks until it is swapped back in;
* ``"finished"`` — it generated ``max_new_tokens`` tokens; its blocks are released.
"""

from __future__ import annotations

from fornax.serving.requests import Request

#: every value :attr:`Sequence.status` takes
STATUSES = ("waiting", "running", "swapped", "finished")


class Sequence:
    """One request's state in the engine.

    Timing fields are simulated seconds on the trace's clock: ``first_token_at`` is when the
    first generated token was produced (time to first token is ``first_token_at -
    request.arrival``), ``token_times`` holds the time of every generated token (inter-token
    latencies are its differences) and ``finished_at`` when the last one was.  A preempted
    sequence keeps all of them: recomputation does not produce its tokens again.
    """

    request: Request
    tokens: list[int]
    num_computed: int
    block_table: list[int]
    host_blocks: list[int]
    status: str
    preemptions: int
    prefix_hit_tokens: int
    first_token_at: float | None
    token_times: list[float]
    finished_at: float | None

    def __init__(self, request: Request):
        self.request = request
        self.tokens = list(request.prompt)
        self.num_computed = 0
        self.block_table = []
        self.host_blocks = []
        self.status = "waiting"
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self.first_token_at = None
        self.token_times = []
        self.finished_at = None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.tokens)

    @property
    def generated(self) -> list[int]:
        """The tokens generated so far (a copy)."""
        return self.tokens[self.prompt_len:]

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def done(self) -> bool:
        """Whether it has generated ``max_new_tokens`` tokens."""
        return self.num_generated >= self.request.max_new_tokens

    @property
    def max_len(self) -> int:
        """The most tokens whose K/V it will ever hold: the prompt and every generated token
        but the last (which is sampled, never computed)."""
        return self.prompt_len + self.request.max_new_tokens - 1

    def __repr__(self) -> str:
        return (f"Sequence({self.id!r}, {self.status}, tokens={self.num_tokens}, "
                f"computed={self.num_computed}, generated={self.num_generated}/"
                f"{self.request.max_new_tokens}, blocks={self.block_table}"
                + (f", host={self.host_blocks}" if self.host_blocks else "") + ")")


__all__ = ["STATUSES", "Sequence"]
