"""What a lab is: a goal, live experiments that produce tables and pictures, and exercises
that are checked against what the current code really does.

A :class:`Lab` runs its experiments (:meth:`Lab.run`) into :class:`Section` s -- text,
:class:`Table` s, picture files written into the run's folder -- and lists its
:class:`Exercise` s.  A student's answers live in a folder ``fornax lab new`` writes: an
``answers.toml`` (values; data, never executed) and, for exercises that ask for one, a
file the student writes (a stack config, ...).  Each exercise's check computes the truth
live from the same code, compares, and says what was expected, what was observed and
which seam to look at (:class:`Feedback`); the score is the points of the exercises that
pass.  Reference solutions ship inside the package (``fornax/labs/reference/labNN/``) for
the tests; ``run`` and ``check`` never print them.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..layers.errors import ConfigError


@dataclass(frozen=True)
class Table:
    """A table of a lab run: a title, column names and rows of text."""

    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Section:
    """One experiment's write-up: a heading, text, tables and picture files (names in the
    run's folder)."""

    heading: str
    text: str
    tables: list[Table] = field(default_factory=list)
    pictures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Feedback:
    """The verdict on one exercise."""

    exercise: str
    passed: bool
    points: int
    max_points: int
    expected: str
    observed: str
    look_at: str               # which seam or part of fornax explains it

    @property
    def text(self) -> str:
        if self.passed:
            return f"correct: {self.observed}"
        return f"expected {self.expected}, your answer: {self.observed}; look at {self.look_at}"


#: what a check gets: the student's answers (from answers.toml), the folder they are in, and
#: the lab's live facts (computed once per check); returns (passed, expected, observed)
Check = Callable[[dict[str, Any], Path, dict[str, Any]], tuple[bool, str, str]]


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: its id (``answers.toml`` key), the question, its points, where to
    look when it fails, and its check."""

    id: str
    prompt: str
    check: Check
    look_at: str
    points: int = 1


@dataclass(frozen=True)
class Lab:
    """One lab of the series."""

    number: int
    slug: str
    title: str
    part: str                         # the series part it teaches
    goal: str
    minutes: int                      # the time a student needs, roughly
    experiments: Callable[[Path], list[Section]]
    exercises: list[Exercise]
    facts: Callable[[], dict[str, Any]]          # the live truths the checks compare against
    starter_files: dict[str, str] = field(default_factory=dict)   # extra files `new` writes

    def run(self, out: Path) -> list[Section]:
        """Run the experiments live, writing pictures into ``out``."""
        out.mkdir(parents=True, exist_ok=True)
        return self.experiments(out)

    def starter(self) -> dict[str, str]:
        """The files ``fornax lab new`` writes: answers.toml with every exercise blank, and the
        lab's other starter files."""
        lines = [f"# Lab {self.number}: {self.title}. Fill in each answer, then run "
                 f"`fornax lab check {self.number}` in this folder.", ""]
        for ex in self.exercises:
            lines.append(f"# {ex.id}: {ex.prompt}")
            lines.append(f'{_key(ex.id)} = ""')
            lines.append("")
        return {"answers.toml": "\n".join(lines), **self.starter_files}

    def check(self, folder: Path) -> list[Feedback]:
        """Check the answers in ``folder`` against the lab's live facts."""
        answers = load_answers(folder)
        facts = self.facts()
        out = []
        for ex in self.exercises:
            try:
                ok, expected, observed = ex.check(answers, folder, facts)
            except ConfigError as exc:           # a file the student wrote is malformed
                ok, expected, observed = False, "a valid answer", exc.message
            out.append(Feedback(ex.id, ok, ex.points if ok else 0, ex.points, expected, observed, ex.look_at))
        return out

    def reference_dir(self) -> Path:
        """The packaged reference solution's folder (for tests)."""
        path = resources.files(__package__) / "reference" / f"lab{self.number:02d}"
        return Path(str(path))


def figure(width: float, height: float) -> Any:
    """A matplotlib figure of ``width`` x ``height`` inches on its own Agg canvas (pyplot's
    global state is left alone): every lab draws its picture on one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _key(exercise_id: str) -> str:
    return "ex" + exercise_id.replace(".", "_")


def load_answers(folder: Path) -> dict[str, Any]:
    """``folder/answers.toml`` as data (keys ``ex9_1``...); a clear error when it is missing or
    malformed."""
    path = folder / "answers.toml"
    if not path.is_file():
        raise ConfigError(f"no answers.toml in {folder}",
                          hint="run `fornax lab new N DIR` to write the starter files, then answer in DIR")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})", hint="keep one `key = value` per answer") from None


def answer(answers: dict[str, Any], exercise_id: str) -> Any:
    """The student's answer to an exercise ("" when left blank)."""
    return answers.get(_key(exercise_id), "")


# ---- checks shared by every lab -------------------------------------------------------------
def text_fact(exercise_id: str, fact: str) -> Check:
    """The answer names the live fact ``fact`` (case and surrounding space ignored)."""
    def check(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
        got = str(answer(answers, exercise_id)).strip()
        want = str(facts[fact])
        return got.lower() == want.lower(), want, got or "(blank)"
    return check


def number_fact(exercise_id: str, fact: str, rel: float = 0.0) -> Check:
    """The answer is the live number ``fact``, within ``rel`` relative (exact when 0)."""
    def check(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
        got = answer(answers, exercise_id)
        want = float(facts[fact])
        shown = f"{want:g}" + (f" (within {rel:.0%})" if rel else "")
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return False, shown, repr(got) if got != "" else "(blank)"
        ok = math.isclose(float(got), want, rel_tol=rel, abs_tol=0.0 if rel else 1e-12)
        return ok, shown, f"{got:g}"
    return check
