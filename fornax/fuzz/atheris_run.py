"""Coverage-guided fuzzing of the byte and text loaders with atheris (libFuzzer), the
optional companion of :mod:`fornax.fuzz.loaders` (``make fuzz-atheris``; needs the
``fuzz`` extra: ``pip install -e '.[fuzz]'``).

Hypothesis mutates a valid example at random; libFuzzer keeps every input that reaches new
code and mutates those, which pays where a decoder has deep, nested structure — the binary
images, the container framing, the ISA's encoded and text forms, the assembly dialects, the
compile-cache entries.  The property is the same as in ``make fuzz``: the loader returns or
raises the fornax error it documents; anything else is a crash libFuzzer reports with the
input that caused it, and a case over the time limit is a hang.

``python -m fornax.fuzz.atheris_run --target NAME [--runs N] [--seconds S]`` fuzzes
one target in this process (libFuzzer ends the process); without ``--target`` every byte or
text target runs, each in a child process, and the exit code is 1 when any crashed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: targets whose input is bytes or text (the CLI and JSON-document targets stay with hypothesis)
SKIPPED = ("cli", "report-json")


def _case(name: str, data: bytes):
    """The target's input built from libFuzzer's bytes (the seed supplies the rest)."""
    from .loaders import _seeds
    if name in ("isa-binary", "container", "compile-cache"):
        return data
    text = data.decode("utf-8", "replace")
    if name.endswith("-image"):
        import dataclasses
        driver, binary = _seeds()[name]
        return driver, dataclasses.replace(binary, data=data)
    if name.endswith("-assembly") and name != "isa-assembly":
        return _seeds()[name][0], text
    return text


def _corpus(name: str) -> bytes:
    """The target's valid example, libFuzzer's starting point."""
    from .loaders import _seeds
    if name in ("stack-config", "chip-spec"):
        return b""
    seed = _seeds()[name if name != "container" else "isa-binary"]
    if name == "compile-cache":
        return seed[0]
    if name.endswith("-image"):
        return seed[1].data
    if name.endswith("-assembly") and name != "isa-assembly":
        return seed[1].encode()
    return seed if isinstance(seed, bytes) else str(seed).encode()


def fuzz_one(name: str, runs: int, seconds: int, corpus_dir: str | None) -> None:
    import tempfile

    import atheris

    from . import loaders as fz
    target = next((t for t in fz.targets() if t.name == name), None)
    if target is None or name in SKIPPED:
        raise SystemExit(f"no byte or text target {name!r}; choose from {', '.join(names())}")
    fz._seeds()                                    # build the examples before fuzzing starts
    atheris.instrument_all()                       # coverage of every loaded fornax function

    def one_input(data: bytes) -> None:
        try:
            target.run(_case(name, data))
        except target.allowed:
            pass

    argv = [sys.argv[0], f"-runs={runs}", f"-max_total_time={seconds}", f"-timeout={int(fz.LIMIT_S)}",
            "-rss_limit_mb=4096"]
    from pathlib import Path
    corpus = Path(corpus_dir or tempfile.mkdtemp(prefix=f"fornax-fuzz-{name}-"))
    corpus.mkdir(parents=True, exist_ok=True)
    (corpus / "seed").write_bytes(_corpus(name))
    argv.append(str(corpus))
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def names() -> list[str]:
    from .loaders import targets
    return [t.name for t in targets() if t.name not in SKIPPED]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fornax.fuzz.atheris_run",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="one target (default: every byte or text target)")
    ap.add_argument("--runs", type=int, default=20000, help="inputs per target (default 20000)")
    ap.add_argument("--seconds", type=int, default=60, help="time limit per target (default 60)")
    ap.add_argument("--corpus", default=None, help="a directory that keeps the inputs libFuzzer found")
    args = ap.parse_args(argv)
    if args.target:
        fuzz_one(args.target, args.runs, args.seconds, args.corpus)
        return 0
    failed = []
    for name in names():
        cmd = [sys.executable, "-m", "fornax.fuzz.atheris_run", "--target", name,
               "--runs", str(args.runs), "--seconds", str(args.seconds)]
        if args.corpus:
            cmd += ["--corpus", f"{args.corpus}/{name}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        done = [line for line in proc.stderr.splitlines() if line.startswith("Done ")]
        print(json.dumps({"target": name, "exit": proc.returncode,
                          "result": done[-1] if done else proc.stderr.strip().splitlines()[-1:]}))
        if proc.returncode != 0:
            failed.append(name)
            sys.stderr.write(proc.stderr[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
