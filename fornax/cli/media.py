"""``fornax media``: video to tensor — frames decoded on the chip's media engines feed a CNN
on the compute engine, pipelined on one device's timeline (:mod:`fornax.scenarios.media`).

Prints the simulated frames per second, each engine's busy time and utilisation, the
bottleneck and the decode/compute overlap; ``--json`` prints the ``fornax.media/1``
document and ``--trace FILE`` writes the Perfetto/Chrome trace (media engines on their
own tracks).  Exit 1 when the decoded frames or the CNN outputs do not check out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..report import fmt_time
from ..scenarios.media import HOST_CODECS, parse_resolution, run_media
from ..sim.trace import chrome_trace
from ..stack import get_vendor
from .errors import debug_option, handle_errors


@click.command("media")
@click.option("--vendor", default="cuda-like", show_default=True, metavar="F",
              help="The family whose stack (and decode API) runs the pipeline.")
@click.option("--spec", default="tiny", show_default=True, metavar="CHIP",
              help="Chip spec (a shipped name or a .toml file); its [media] table gives the engines.")
@click.option("--frames", default=8, show_default=True, type=int, help="Frames to decode and classify.")
@click.option("--resolution", default="64x48", show_default=True, metavar="WxH", help="Frame size.")
@click.option("--codec", default="mjpeg", show_default=True, type=click.Choice(HOST_CODECS),
              help="Bitstream codec (the host encodes motion-JPEG with Pillow).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the frames and the CNN.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the Perfetto/Chrome trace of the device timeline to FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print the fornax.media/1 JSON document.")
@debug_option
@handle_errors
def media_cmd(vendor, spec, frames, resolution, codec, seed, trace_file, as_json, debug):
    """Decode video on the media engines while a CNN runs on the compute engine."""
    get_vendor(vendor)                       # an unknown family: one line naming the choices
    width, height = parse_resolution(resolution)
    doc, stack = run_media(vendor=vendor, spec=spec, frames=frames, width=width, height=height,
                           codec=codec, seed=seed)
    if trace_file:
        Path(trace_file).write_text(json.dumps(chrome_trace(stack.devices)))
        doc["trace"] = str(trace_file)
    ok = doc["frames_match_pillow"] and doc["numerics"]["ok"]
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        console = Console()
        api = doc["decode_api"]
        t = Table(title=f"{doc['vendor']} on {doc['spec']}: {doc['frames']} {codec} frames of "
                        f"{width}x{height}, {doc['sessions']} decode session(s) "
                        f"({escape(api['api'])}: {escape(api['decode'])})")
        for col in ("engine", "kind", "busy (simulated)", "utilisation"):
            t.add_column(col)
        for row in doc["engines"]:
            t.add_row(row["engine"], row["kind"], fmt_time(row["busy_s"]), f"{row['utilisation']:.1%}")
        console.print(t)
        console.print(f"frames/s (simulated): {doc['frames_per_s']:.1f} over {fmt_time(doc['simulated_s'])}; "
                      f"bottleneck: {doc['bottleneck']}; decode and compute overlap "
                      f"{fmt_time(doc['overlap_s'])}")
        console.print(f"decode {fmt_time(doc['decode_s_per_frame'])} per frame per engine; CNN "
                      f"{fmt_time(doc['cnn_s_per_frame'])} per frame")
        n = doc["numerics"]
        console.print(f"decoded frames equal Pillow's: {'yes' if doc['frames_match_pillow'] else 'NO'}; "
                      f"CNN vs numpy: max rel err {n['max_rel_err']:.2e} (tol {n['tol']:.0e}) "
                      f"{'ok' if n['ok'] else 'FAIL'}")
        if trace_file:
            console.print(f"trace: {escape(str(trace_file))}")
    if not ok:
        sys.exit(1)
