"""Driver contexts and the current-context rules.

A family's ``[driver.contexts] current`` fact decides which context a call
without one uses: ``thread`` (a per-thread stack, as cuCtxPushCurrent and
cuCtxSetCurrent keep it), ``device`` (the thread's device's primary context,
as hipSetDevice selects it) or ``explicit`` (no current context: every call
takes one, as Level Zero's do).
"""

from __future__ import annotations

from .core import DriverCore, handles
from .protocol import Context


class ContextRules(DriverCore):
    """Creating and destroying contexts, primary contexts, and the thread-current stack."""

    def create_context(self, index: int) -> Context:
        dev = self._device(index, "create_context")
        self._check_lost(dev, "create_context")
        ctx = Context(next(handles), dev, dev.memory.create_space())
        if self.peer_rule == "query":
            # no enable call in this family: contexts reach every peer the query allows
            for other in self.contexts:
                if other.live and self.can_access_peer(index, self.devices.index(other.device)):
                    ctx.space.grant_peer(other.space)
                    other.space.grant_peer(ctx.space)
        self.contexts.append(ctx)
        self.counts["contexts"] += 1
        if self.context_rule == "thread":
            self._stack().append(ctx)          # cuCtxCreate makes the new context current
        return ctx

    def destroy_context(self, ctx: Context) -> None:
        if not isinstance(ctx, Context) or not ctx.live:
            raise self.fail("invalid_context", "context already destroyed", call="destroy_context")
        ctx.device.memory.destroy_space(ctx.space)
        ctx.live = False
        if ctx in self.contexts:
            self.contexts.remove(ctx)
        for module in [m for m in self.modules.values() if m.context is ctx]:
            module.loaded = False
            del self.modules[module.handle]
        for q in list(ctx.queues):
            q.destroyed = True
            ctx.device.timeline.remove_queue(q.hwq)     # a queue lives on its context's device
        ctx.queues.clear()
        stack = self._stack()
        if ctx in stack:
            stack.remove(ctx)                  # destroying a current context pops it
        self._managed = {va: r for va, r in self._managed.items() if r.space is not ctx.space}
        for other in self.contexts:
            other.space.revoke_peer(ctx.space)
        self._peer_enabled = {p for p in self._peer_enabled if ctx.handle not in p}

    # -- the current context ------------------------------------------------
    def _stack(self) -> list[Context]:
        stack: list[Context] | None = getattr(self._tls, "stack", None)
        if stack is None:
            stack = self._tls.stack = []
        return stack

    def _thread_device(self) -> int:
        device: int = getattr(self._tls, "device", 0)
        return device

    def _current_rule(self, call: str) -> None:
        if self.context_rule == "explicit":
            raise self.fail("not_supported", f"{self.facts['driver']['api']} has no current "
                            "context: every call takes its context", call=call,
                            hint="pass the context returned by create_context")

    def primary_context(self, index: int) -> Context:
        """The device's primary context (created on first use, again after a reset)."""
        ctx = self._primary.get(index)
        if ctx is None or not ctx.live:
            stack = self._stack()
            ctx = self.create_context(index)
            if self.context_rule == "thread" and stack and stack[-1] is ctx:
                stack.pop()                    # retaining a primary context does not push it
            self._primary[index] = ctx
        return ctx

    def set_device(self, index: int) -> Context:
        """Make device ``index``'s primary context this thread's current one
        (``[driver.calls] set_device``: hipSetDevice; cudaSetDevice over the driver API)."""
        self._current_rule("set_device")
        self._device(index, "set_device")
        ctx = self.primary_context(index)
        self._tls.device = index
        stack = self._stack()
        if self.context_rule == "thread":
            if stack:
                stack[-1] = ctx
            else:
                stack.append(ctx)
        else:
            stack.clear()
        return ctx

    def set_current(self, ctx: Context | None) -> None:
        """cuCtxSetCurrent: replace the top of this thread's stack (None pops it)."""
        self._current_rule("set_current")
        stack = self._stack()
        if ctx is None:
            if stack:
                stack.pop()
            return
        self.check(ctx, "set_current")
        if stack:
            stack[-1] = ctx
        else:
            stack.append(ctx)

    def get_current(self) -> Context | None:
        """cuCtxGetCurrent: this thread's current context, or None (not an error)."""
        self._current_rule("get_current")
        stack = self._stack()
        if stack:
            return stack[-1]
        if self.context_rule == "device":
            return self.primary_context(self._thread_device())
        return None

    def push_current(self, ctx: Context) -> None:
        """cuCtxPushCurrent: ``ctx`` becomes current on top of the thread's stack."""
        self._current_rule("push_current")
        self.check(ctx, "push_current")
        self._stack().append(ctx)

    def pop_current(self) -> Context:
        """cuCtxPopCurrent: pop and return the thread's current context."""
        self._current_rule("pop_current")
        stack = self._stack()
        if not stack:
            raise self.fail("invalid_context", "this thread's context stack is empty",
                            call="pop_current")
        return stack.pop()

    def resolve_context(self, ctx: Context | None, call: str) -> Context:
        """The context a call works in: the one given, else the family's current context."""
        if ctx is not None:
            return ctx
        if self.context_rule == "thread":
            stack = self._stack()
            if not stack:
                raise self.fail("invalid_context", "no context is current to the calling thread",
                                call=call, hint=f"create one ({self.calls.get('create_context')}) "
                                f"or make one current ({self.calls.get('set_current')})")
            return stack[-1]
        if self.context_rule == "device":
            stack = self._stack()
            return stack[-1] if stack else self.primary_context(self._thread_device())
        raise self.fail("invalid_context", f"no context given; {self.facts['driver']['api']} "
                        "passes a context to every call", call=call,
                        hint="pass the context returned by create_context")

    def reset(self, index: int) -> None:
        """Reset device ``index`` (the family's call is ``[driver.calls] reset``): destroy
        every context on it and all their mappings, clear its lost state and failed
        hardware queues.  Old handles and addresses are invalid; new contexts work."""
        dev = self._device(index, "reset")
        group = dev.reset_group()       # a partitioned chip after a chip-wide fault: every partition
        for ctx in list(self.contexts):
            if ctx.live and any(ctx.device is d for d in group):
                self.destroy_context(ctx)
        dev.reset()
        for i, d in enumerate(self.devices):
            if any(d is g for g in group):
                self.lost.pop(i, None)
        self.counts["resets"] += 1
