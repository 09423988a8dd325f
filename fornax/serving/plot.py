"""Latency against load: the picture ``fornax serve --plot`` draws.

Needs matplotlib (the ``plot`` extra); it draws on its own Agg canvas, so pyplot's global
state is left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..layers.errors import ConfigError


def plot_load(points: list[tuple[float, dict[str, dict[str, float]]]], path: str, title: str) -> None:
    """Two panels over the arrival rate: time to first token and time per output token, p50
    and p99 (simulated milliseconds).  ``points``: (rate, :func:`~.metrics.latencies`) pairs."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed: pip install fornax[plot]") from None
    if not Path(path).parent.is_dir():
        raise ConfigError(f"--plot {path}: folder {Path(path).parent} does not exist")
    rates = [r for r, _ in points]
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    axes: Any = fig.subplots(1, 2)
    for ax, (key, label) in zip(axes, (("ttft_s", "time to first token"),
                                       ("tpot_s", "time per output token"))):
        for p, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(rates, [lat[key][p] * 1e3 for _, lat in points], style, label=p)
        ax.set_xlabel("arrival rate (requests per simulated second)")
        ax.set_ylabel("simulated ms")
        ax.set_title(label, fontsize="medium")
        ax.legend(fontsize="small")
    fig.suptitle(f"fornax serve — latency vs load: {title}")
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise ConfigError(f"--plot: cannot write {path}: {exc.strerror or exc}") from None
