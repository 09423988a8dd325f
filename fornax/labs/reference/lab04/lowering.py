"""The reference solution of lab 4, exercise 4.5 (for the tests; fornax lab never prints it):
copysign as graph ops -- |self|, negated where other is negative."""

from typing import Any

OP = "aten::copysign.Tensor"


def lower(ctx: Any, self: Any, other: Any) -> Any:
    magnitude = ctx.op("abs", self)
    negative = ctx.op("lt", other, ctx.scalar(0.0, other.dtype))
    return ctx.op("where", negative, ctx.op("neg", magnitude), magnitude)
