"""Keep every command shown in README.md and docs/*.md true: rewrite what they print.

    python scripts/refresh_readme_example.py            # rewrite every shown output and field table
    python scripts/refresh_readme_example.py --check    # say what differs, change nothing (exit 1 if anything does)

A page shows a command in one of three ways:

- **Checked**: a fenced block tagged `console` whose first line starts with `$ `. Every `$ ` line
  is a command (a line ending in a backslash continues on the next); the lines up to the next `$ `
  line are exactly what it prints, standard output and standard error as a terminal shows them.
  `tests/test_docs_commands.py` runs every such block and fails when the output differs; this
  script rewrites the output instead. A command must exit 0 unless the block's next command is
  `$ echo $?`, which prints its exit status. Commands that can run: `python -m infersim ...` (in
  this process, from the repository root) and `python benchmarks/NAME.py ...` or
  `python scripts/NAME.py ...` (a child process of this interpreter, from the repository root).
- **Shown, not run**: any other fenced block whose first line starts with `$ ` must be announced
  by the paragraph right above it, a visible sentence starting with `*Not run by the tests:` that
  says why (a GPU, PyTorch, ../shared, minutes, or it writes into the repository).
- **Synopsis**: a `bash` block of commands without output. Its `python -m infersim` lines are not
  run (they name files a reader brings), but the test holds every `--flag` in them to the
  subcommand's `--help`.

Normalisation, the only difference allowed between a shown output and the real one: trailing
spaces and trailing blank lines are ignored; the absolute path of the repository (or of an
installed package's bundled data) is shown as `...` (a card's path in a message is
`.../engines/sglang-0.5.yaml` on every machine); a shown line that is `...` (indented or not) stands for
any number of printed lines, and one that ends in ` ...` for any line that begins with what
precedes it (a timing, a worker count). An output with `...` lines is checked, never rewritten: this
script says when one no longer matches, to be cut again by hand; a line ending in ` ...` is kept
where the rewritten output still has a line it matches.

The field tables of the run config and the three kinds of card in docs/inputs.md are generated
from their schemas: each follows its bold title and a blank line and ends at the next blank line.

Figures quoted in prose ("96 compared numbers", "+74.6%") are listed in scripts/quoted_figures.yaml,
each with the checked command whose output holds it: this script rewrites a drifted number in
place, and the docs tests fail while a quote and its command disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

PAGES: tuple[Path, ...] = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
FIELD_TABLE_PAGE = REPO / "docs" / "inputs.md"
NOT_RUN_MARK = "*Not run by the tests:"
ELISION = "..."
FENCE = re.compile(r"^( *)(`{3,})(\S*(?: \S+)*)\s*$")  # a block in a list item is indented; info: a language and words after it


@dataclass(frozen=True)
class Command:
    written: tuple[str, ...]  # the command's lines as the page writes them (`$ ` and continuations)
    shown: tuple[str, ...]  # the output lines shown under it

    @property
    def text(self) -> str:
        """The command alone, continuation lines joined."""
        return " ".join(line.rstrip("\\").strip() for line in self.written)[2:]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    info: str  # the fence's info string (console, text, bash, ...)
    body: tuple[str, ...]  # the lines between the fences
    before: str  # the first line of the paragraph above the opening fence
    indent: str = ""  # the fence's indentation (a block in a list item), taken off the body

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def shows_a_command(self) -> bool:
        return bool(self.body) and self.body[0].startswith("$ ")

    @property
    def checked(self) -> bool:
        return self.info.split()[:1] == ["console"] and self.shows_a_command

    @property
    def slow(self) -> bool:
        """A block fenced ```` ```console slow ````: its command is checked under `pytest -m slow` (a
        renderer reads only the info string's first word)."""
        return "slow" in self.info.split()[1:]

    def commands(self) -> tuple[Command, ...]:
        commands: list[Command] = []
        lines = list(self.body)
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                raise ValueError(f"{self.where}: output before the first command: {lines[i]!r}")
            first = i
            while lines[i].endswith("\\"):
                i += 1
            i += 1
            start = i
            while i < len(lines) and not lines[i].startswith("$ "):
                i += 1
            commands.append(Command(tuple(lines[first:start]), tuple(lines[start:i])))
        return tuple(commands)


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == fence)
        above = [j for j in range(i - 1, -1, -1) if lines[j].strip()]
        before = ""
        if above:  # the first line of the paragraph above the fence
            j = above[0]
            while j > 0 and lines[j - 1].strip() and not FENCE.match(lines[j - 1]):
                j -= 1
            before = lines[j].strip()
        body = tuple(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end])
        found.append(Block(page, i + 1, info, body, before, indent))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


class NotRunnable(ValueError):
    pass


def run(command: str) -> tuple[str, int]:
    """What the command prints (standard output and error, in the order written) and its exit status."""
    argv = shlex.split(command)
    if argv[:3] == ["python", "-m", "infersim"]:
        from infersim.cli.main import main

        buffer = io.StringIO()
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                try:
                    status = main(argv[3:])
                except SystemExit as done:  # argparse's --help and usage errors
                    status = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        finally:
            os.chdir(cwd)
        return buffer.getvalue(), status
    if len(argv) >= 2 and argv[0] == "python" and re.fullmatch(r"(benchmarks|scripts)(/[\w-]+)?/[\w-]+\.py", argv[1]):
        # this checkout's package, and the two streams in the order written, as on a terminal
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "PYTHONUNBUFFERED": "1"}
        done = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=600)
        return done.stdout, done.returncode
    raise NotRunnable(f"not a command the docs runner runs: {command!r} (python -m infersim ..., "
                      "python benchmarks/NAME.py ..., python scripts/NAME.py ..., echo $?)")


#: a progress report on stderr (`infersim: sweep progress: 75.0%, ...`): never part of a shown output
PROGRESS_LINE = re.compile(r"infersim: [\w -]*progress: ")


def normalised(output: str) -> list[str]:
    import infersim

    # the bundled cards and tables: the repository root in a checkout, infersim/_bundled installed
    installed = Path(infersim.__file__).resolve().parent / "_bundled"
    text = output.replace(str(installed), ELISION).replace(str(REPO), ELISION)
    # progress lines depend on how fast the machine is (a slow run prints them, a fast one does not)
    lines = [line.rstrip() for line in text.splitlines() if not PROGRESS_LINE.match(line)]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def same_line(shown: str, printed: str) -> bool:
    """Equal, or the shown line ends in ` ...` and the printed one begins with what precedes it."""
    if shown.endswith(" " + ELISION):
        return printed.startswith(shown[:-len(ELISION)])
    return shown == printed


def same_lines(shown: list[str], printed: list[str]) -> bool:
    return len(shown) == len(printed) and all(same_line(a, b) for a, b in zip(shown, printed))


def matches(shown: tuple[str, ...] | list[str], printed: list[str]) -> bool:
    """Shown lines equal to the printed ones, a line `...` standing for any number of lines."""
    shown = [line.rstrip() for line in shown]
    while shown and not shown[-1]:
        shown.pop()
    if not any(line.strip() == ELISION for line in shown):
        return same_lines(shown, printed)
    pieces: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == ELISION:
            pieces.append([])
        else:
            pieces[-1].append(line)
    head, *middle, tail = pieces
    if len(printed) < len(head) + len(tail) or not same_lines(head, printed[:len(head)]):
        return False
    if tail and not same_lines(tail, printed[len(printed) - len(tail):]):
        return False
    position, stop = len(head), len(printed) - len(tail)
    for piece in middle:
        found = next((k for k in range(position, stop - len(piece) + 1)
                      if same_lines(piece, printed[k:k + len(piece)])), None)
        if found is None:
            return False
        position = found + len(piece)
    return True


@dataclass(frozen=True)
class Outcome:
    command: Command
    printed: tuple[str, ...]  # normalised
    status: int
    status_shown: bool  # the block's next command is `echo $?`

    @property
    def ok(self) -> bool:
        return matches(self.command.shown, list(self.printed)) and (self.status == 0 or self.status_shown)


class Runner:
    """Runs each distinct command once (validate takes ~20 s; several pages show it)."""

    def __init__(self) -> None:
        self.done: dict[str, tuple[str, int]] = {}

    def run(self, command: str) -> tuple[str, int]:
        if command not in self.done:
            self.done[command] = run(command)
        return self.done[command]

    def outcomes(self, block: Block) -> list[Outcome]:
        outcomes: list[Outcome] = []
        commands = block.commands()
        status = 0
        for k, command in enumerate(commands):
            if command.text.strip() == "echo $?":
                printed, current = f"{status}\n", 0
            else:
                printed, current = self.run(command.text)
            follows = k + 1 < len(commands) and commands[k + 1].text.strip() == "echo $?"
            outcomes.append(Outcome(command, tuple(normalised(printed)), current, follows))
            status = current
        return outcomes


def difference(outcome: Outcome) -> str:
    if outcome.status != 0 and not outcome.status_shown:
        return f"$ {outcome.command.text}\nexited {outcome.status} (show `$ echo $?` after it if that is the point):\n" \
               + "\n".join(outcome.printed)
    return "\n".join(difflib.unified_diff(list(outcome.command.shown), list(outcome.printed), "shown", "printed now",
                                          lineterm=""))


# --- field tables --------------------------------------------------------------------------------

def field_tables() -> tuple[tuple[str, str], ...]:
    from infersim.cards.engine import EngineCard
    from infersim.cards.hardware import HardwareCard
    from infersim.cards.model import ModelCard
    from infersim.cards.schema import field_docs
    from infersim.run.config import RunSpec

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def table(cls: type) -> str:
        rows = ["| field | type | meaning |", "|---|---|---|"]
        # a type or meaning with a '|' in it (str | None) would split its cell: escaped, as GitHub's tables read it
        rows += [f"| `{name}` | {cell(kind)} | {cell(doc)} |" for name, kind, doc in field_docs(cls)]
        return "\n".join(rows)

    return (("**Run config**", table(RunSpec)), ("**Model card**", table(ModelCard)),
            ("**Hardware card**", table(HardwareCard)), ("**Engine card**", table(EngineCard)))


def with_field_tables(page: str) -> str:
    """Each table follows its bold title and a blank line and ends at the next blank line."""
    for title, table in field_tables():
        start = page.index(title + "\n\n") + len(title) + 2
        end = page.index("\n\n", start)
        page = page[:start] + table + page[end:]
    return page


# --- rewriting -----------------------------------------------------------------------------------

def keeping_line_elisions(shown: tuple[str, ...], printed: list[str]) -> list[str]:
    """The printed lines, each shown line that ends in ` ...` kept in place of the first printed line
    it still matches (a timing stays elided when everything around it is rewritten)."""
    lines = list(printed)
    used: set[int] = set()
    for line in shown:
        if line.rstrip().endswith(" " + ELISION):
            found = next((k for k, text in enumerate(lines) if k not in used and same_line(line.rstrip(), text)), None)
            if found is not None:
                lines[found] = line.rstrip()
                used.add(found)
    return lines


def _pieces(shown: tuple[str, ...]) -> tuple[list[list[str]], list[str], list[str]]:
    """The runs of shown lines between elisions, the elision lines as written, the trailing blanks."""
    lines = [line.rstrip() for line in shown]
    trailing: list[str] = []
    while lines and not lines[-1]:
        trailing.append(lines.pop())
    pieces: list[list[str]] = [[]]
    elisions: list[str] = []
    for line in lines:
        if line.strip() == ELISION:
            pieces.append([])
            elisions.append(line)
        else:
            pieces[-1].append(line)
    return pieces, elisions, trailing


def _closest(line: str, printed: list[str], start: int) -> int | None:
    """The printed line at or after `start` most like `line` (at least 60% alike), first on ties."""
    best, best_ratio = None, 0.6
    for k in range(start, len(printed)):
        ratio = difflib.SequenceMatcher(None, line, printed[k], autojunk=False).ratio()
        if ratio > best_ratio:
            best, best_ratio = k, ratio
            if ratio == 1.0:
                break
    return best


def recut_elided(shown: tuple[str, ...], printed: list[str]) -> list[str]:
    """An elided output cut again from what is printed now: each run of shown lines between `...`
    becomes the printed lines from the first to the last it still resembles (the head starts at the
    first printed line, the tail ends at the last), so the cut keeps its shape and takes new numbers.
    The caller checks the result still matches; a cut that cannot be recovered is left to a person."""
    pieces, elisions, trailing = _pieces(shown)
    cut: list[str] = []
    position = 0
    for index, piece in enumerate(pieces):
        if index:
            cut.append(elisions[index - 1])
        if not piece:
            continue
        found = [k for k in (_closest(line, printed, position) for line in piece) if k is not None]
        found = [k for i, k in enumerate(found) if all(k > j for j in found[:i])]
        if not found:
            return list(shown)
        first = 0 if index == 0 else found[0]
        last = len(printed) - 1 if index == len(pieces) - 1 else found[-1]
        cut.extend(printed[first:last + 1])
        position = last + 1
    return cut + trailing


def refreshed_block(block: Block, runner: Runner) -> tuple[list[str], list[str]]:
    """The block's body with every output as printed now, and the problems this cannot fix."""
    body: list[str] = []
    problems: list[str] = []
    for outcome in runner.outcomes(block):
        body.extend(outcome.command.written)
        if outcome.status != 0 and not outcome.status_shown:
            problems.append(f"{block.where}: {difference(outcome)}")
        if any(line.strip() == ELISION for line in outcome.command.shown):
            recut = recut_elided(outcome.command.shown, list(outcome.printed))
            body.extend(recut)
            if not matches(recut, list(outcome.printed)):
                problems.append(f"{block.where}: an elided output no longer matches; cut it again by hand:\n"
                                + difference(outcome))
        else:
            body.extend(keeping_line_elisions(outcome.command.shown, list(outcome.printed)))
    return body, problems


def refresh(check: bool = False) -> int:
    runner = Runner()
    changed: list[str] = []
    problems: list[str] = []
    for page in PAGES:
        text = page.read_text()
        lines = text.splitlines()
        for block in reversed([b for b in blocks(page) if b.checked]):
            body, trouble = refreshed_block(block, runner)
            problems += trouble
            if body != list(block.body):
                changed.append(block.where)
                lines[block.line:block.line + len(block.body)] = [block.indent + line if line else line for line in body]
        new = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
        if page == FIELD_TABLE_PAGE:
            tabled = with_field_tables(new)
            if tabled != new:
                changed.append(f"{page.relative_to(REPO)}: field tables")
            new = tabled
        if new != text and not check:
            page.write_text(new)
    changed += refresh_figures(runner, check)
    problems += figure_problems(runner)
    for where in changed:
        print(f"{'differs' if check else 'rewrote'}: {where}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems or (check and changed) else 0


# --- figures quoted in prose (scripts/quoted_figures.yaml) ---------------------------------------

def checked_commands() -> set[str]:
    return {command.text for block in all_blocks() if block.checked for command in block.commands()}


def output_of(runner: Runner) -> Callable[[str], str]:
    return lambda command: "\n".join(normalised(runner.run(command)[0]))


def figure_problems(runner: Runner, slow: bool | None = None) -> list[str]:
    """Quotes of figures whose page or numbers no longer agree with their command's output: all of
    them, or (`slow` True or False) only those that read, or do not read, a command that only
    ```` ```console slow ```` blocks run."""
    import quoted_figures

    quotes = quoted_figures.load()
    if slow is not None:
        fast = {command.text for block in all_blocks() if block.checked and not block.slow
                for command in block.commands()}
        slow_only = checked_commands() - fast
        quotes = [quote for quote in quotes if bool({quote.command, *quote.sources} & slow_only) == slow]
    return quoted_figures.problems(output_of(runner), checked_commands(), quotes=quotes)


def refresh_figures(runner: Runner, check: bool) -> list[str]:
    """Rewrite the numbers of drifted quotes (unless `check`); the pages that changed."""
    import quoted_figures

    changed = []
    for page in sorted({quote.page for quote in quoted_figures.load()}):
        text = (REPO / page).read_text()
        new = quoted_figures.rewritten(page, text, output_of(runner))
        if new != text:
            changed.append(f"{page}: quoted figures")
            if not check:
                (REPO / page).write_text(new)
    return changed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="say what differs, change nothing")
    sys.exit(refresh(parser.parse_args().check))
