"""P1b: one eager training step of a 2-layer GPT-2-style model on the ``fornax`` device against
PyTorch CPU eager, measured in the same run.

The model is ``transformers.GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4,
vocab_size=1000, n_positions=128))`` with random weights from a fixed seed (the config's
default dropout; its bos/eos token ids moved inside the small vocabulary, which changes no
computation), trained on a batch of ``BATCH`` x ``SEQ`` random tokens.  One step is the
forward with labels, ``loss.backward()``, a ``torch.optim.AdamW`` step and ``zero_grad``; on
fornax (``ft.use_stack(family)``, the model ``copy.deepcopy(...).to("fornax")``, the inputs
``.to("fornax")``) the step ends with ``torch.fornax.synchronize()``, so every simulated kernel
of it has run.  Each figure is the best wall time of ``REPEATS`` steps after ``WARMUP`` steps.
Target: at most ``STEP_TARGET`` x the CPU step on every family; recorded
(``benchmarks.results``), never asserted.
"""

from __future__ import annotations

import copy

from rich.console import Console
from rich.table import Table

from fornax.stack import BUILTIN_FAMILIES

from . import best
from .results import Figures

VENDORS = BUILTIN_FAMILIES
STEP_TARGET = 5.0               # P1b: eager training step, x PyTorch CPU eager, every family
CONFIG = {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000, "n_positions": 128}
BATCH, SEQ = 4, 64
WARMUP, REPEATS = 2, 5
LR = 1e-3
SEED = 0

CPU = "torch CPU eager"
FIGURES = Figures("gpt2.step_s[{device}]", "gpt2.step_vs_cpu[{family}]",
                  choices={"device": (CPU, *VENDORS), "family": VENDORS})


def build():
    """The CPU model (float32, training mode) with seeded random weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(GPT2Config(**CONFIG, bos_token_id=0, eos_token_id=0))
    model.loss_type = "ForCausalLM"          # its class name does not say so (silences a notice)
    return model.train()


def tokens():
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=g)


def make_step(model, ids, sync=None):
    """One training step of ``model`` on ``ids`` (a closure over its own AdamW)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sync is not None:
            sync()
    return step


def _best(step, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        step()
    return best(step, repeats)


def measure(vendors=VENDORS, warmup: int = WARMUP, repeats: int = REPEATS) -> list[tuple[str, float]]:
    """``[(device, best step seconds)]``: PyTorch CPU eager first, then each family."""
    import torch

    import fornax.frameworks.torch as ft

    base, ids = build(), tokens()
    rows = [(CPU, _best(make_step(copy.deepcopy(base), ids), warmup, repeats))]
    for vendor in vendors:
        ft.use_stack(vendor)
        model = copy.deepcopy(base).to("fornax")
        step = make_step(model, ids.to("fornax"), sync=torch.fornax.synchronize)
        rows.append((vendor, _best(step, warmup, repeats)))
    return rows


def main(vendors=VENDORS) -> list[tuple[str, float]]:
    rows = measure(vendors)
    cpu = rows[0][1]
    table = Table(title=f"GPT-2-style 2-layer model (n_embd {CONFIG['n_embd']}, {CONFIG['n_head']} heads, "
                        f"vocab {CONFIG['vocab_size']}), eager training step on {BATCH}x{SEQ} tokens "
                        f"(forward + loss.backward + AdamW + zero_grad), best of {REPEATS} after "
                        f"{WARMUP} warm-up (target ≤ {STEP_TARGET:g}x torch CPU eager)")
    for col in ("device", "step", "vs torch CPU eager", "target met"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for name, s in rows:
        FIGURES.record(f"gpt2.step_s[{name}]", s, "s")
        met = "—"
        if name != CPU:
            fig = FIGURES.record(f"gpt2.step_vs_cpu[{name}]", s / cpu, "x", target=STEP_TARGET)
            met = "yes" if fig["met"] else "no"
        table.add_row(name, f"{s * 1e3:.1f} ms", f"{s / cpu:.2f}x", met)
    Console().print(table)
    return rows


if __name__ == "__main__":
    main()
