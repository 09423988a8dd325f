"""How bytes really move between the ranks' processes: gloo on CPU staging buffers.

Every rank's process simulates its own device; what one rank's collective reads from its
device memory reaches the others through a CPU gloo process group on the same store (gloo
refuses fornax tensors, and the bytes are host bytes anyway).  Each exchange also carries
the rank's *arrival* — the simulated time its collective became ready on its device — so
every rank can start the collective at the latest arrival, as a real one does.

The exchange is the transport only: no simulated time is charged for it (the simulated
cost comes from the topology, :mod:`.timing`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist


class ExchangeError(RuntimeError):
    """The transport failed: a peer process died or did not join within the timeout."""


class RemoteFailure(ExchangeError):
    """One or more ranks announced that their side of the collective failed (a link failure,
    a lost device): every rank of the exchange raises it, at the same collective."""

    def __init__(self, failures: dict[int, str]):
        self.failures = failures
        super().__init__("; ".join(f"rank {r} reported: {m}" for r, m in sorted(failures.items())))


def _reason(exc: BaseException) -> str:
    """gloo's message without its source location and its advice (what happened, in a line)."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically")[0].strip().rstrip(".")


@dataclass
class Arrival:
    """One rank's part of an exchange: its bytes and when its collective became ready."""

    data: np.ndarray          # uint8
    at: float                 # simulated seconds on that rank's device


class Exchange:
    """All-gather and point-to-point of byte buffers and arrival times between the ranks."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        self.rank, self.size, self.timeout = rank, size, timeout
        self._pg = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._store = store
        self._sending: list[tuple[dist.Work, torch.Tensor]] = []   # posted sends, their buffers
        #: set while this rank's side of a collective has failed: the next all-gather sends the
        #: message instead of the data, so every rank learns of it at the same exchange
        self.failure: str | None = None

    def enter(self, seq: int, call: str) -> None:
        """Note in the store the collective this rank is entering (a flight recorder: on a
        timeout every rank can tell who never got there)."""
        self._store.set(f"flight/{self.rank}", f"{seq}\t{call}")

    def behind(self, seq: int) -> list[tuple[int, int | None, str]]:
        """The ranks that had not entered collective ``seq``: (rank, the sequence number and
        call each entered last, or None and "" for none at all)."""
        late: list[tuple[int, int | None, str]] = []
        for r in range(self.size):
            key = f"flight/{r}"
            if not self._store.check([key]):
                late.append((r, None, ""))
                continue
            last, _, call = self._store.get(key).decode().partition("\t")
            if int(last) < seq:
                late.append((r, int(last), call))
        return late

    def abort(self) -> None:
        """Close the transport: peers waiting on this rank fail now instead of at the timeout."""
        self._pg.abort()

    def _wait(self, work: dist.Work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            raise ExchangeError(_reason(exc)) from None

    def all_gather(self, data: np.ndarray, at: float, what: str) -> list[Arrival]:
        """Every rank's ``data`` (uint8, any length) and arrival, by rank."""
        if self.failure is not None:
            data = np.frombuffer(self.failure.encode(), dtype=np.uint8)
        head = torch.tensor([float(at), float(data.size), float(self.failure is not None)], dtype=torch.float64)
        heads = [torch.empty(3, dtype=torch.float64) for _ in range(self.size)]
        self._wait(self._pg.allgather([heads], [head]), what)
        longest = int(max(h[1].item() for h in heads))
        mine = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data.size:
            mine[:data.size] = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))
        outs = [torch.empty(max(longest, 1), dtype=torch.uint8) for _ in range(self.size)]
        self._wait(self._pg.allgather([outs], [mine]), what)
        failed = {r: bytes(o[:int(h[1].item())].numpy()).decode(errors="replace")
                  for r, (o, h) in enumerate(zip(outs, heads)) if h[2].item()}
        if failed:
            raise RemoteFailure(failed)
        return [Arrival(o[:int(h[1].item())].numpy().copy(), float(h[0].item())) for o, h in zip(outs, heads)]

    def send(self, data: np.ndarray, at: float, dst: int, tag: int, what: str) -> None:
        """Post ``data`` to ``dst`` without waiting for it to be received (a send completes when
        its peer receives; two ranks sending to each other first must not wait on each other).
        The posted buffers stay alive until their sends complete."""
        head = torch.tensor([float(at), float(data.size)], dtype=torch.float64)
        self._sending = [(w, b) for w, b in self._sending if not w.is_completed()]
        self._sending.append((self._pg.send([head], dst, tag), head))
        if data.size:
            body = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True))
            self._sending.append((self._pg.send([body], dst, tag), body))

    def flush(self, what: str) -> None:
        """Wait until every posted send has been received."""
        sending, self._sending = self._sending, []
        for w, _ in sending:
            self._wait(w, what)

    def recv(self, src: int, tag: int, what: str) -> Arrival:
        head = torch.empty(2, dtype=torch.float64)
        self._wait(self._pg.recv([head], src, tag), what)
        n = int(head[1].item())
        buf = torch.empty(n, dtype=torch.uint8)
        if n:
            self._wait(self._pg.recv([buf], src, tag), what)
        return Arrival(buf.numpy().copy(), float(head[0].item()))
