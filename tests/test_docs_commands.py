"""The README and docs/*.md show what the commands print now.

Every fenced `console` block that starts with `$ ` is run and its output compared with the one shown
(conventions: docs/README.md, "How the commands on these pages stay true";
scripts/refresh_readme_example.py rewrites the outputs after a deliberate change). Each distinct
command runs once per session: several pages show the same `validate`, which takes ~10 s.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import COMMANDS_RUN_ONCE, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import refresh_readme_example as docs  # noqa: E402

BLOCKS = docs.all_blocks()
CHECKED = [block for block in BLOCKS if block.checked]
#: one worker runs every test of this file (`--dist loadgroup`), so each command runs once, not once per worker
pytestmark = pytest.mark.xdist_group(COMMANDS_RUN_ONCE)

REFRESH = "run `python scripts/refresh_readme_example.py` (and cut `...` blocks by hand) after a deliberate change"


@pytest.fixture(scope="session")
def runner(commands_run_once: docs.Runner) -> docs.Runner:
    return commands_run_once


@pytest.mark.parametrize("block", [pytest.param(block, marks=pytest.mark.slow) if block.slow else block
                                   for block in CHECKED], ids=[block.where for block in CHECKED])
def test_a_shown_command_prints_what_is_shown(block: docs.Block, runner: docs.Runner) -> None:
    for outcome in runner.outcomes(block):
        assert outcome.ok, f"{block.where}: {REFRESH}\n{docs.difference(outcome)}"


def test_the_pages_show_commands_that_run() -> None:
    """The three questions, set-up's main command and the accuracy table are among the checked blocks."""
    readme = [block for block in CHECKED if block.page.name == "README.md" and block.page.parent == REPO_ROOT]
    commands = [command.text for block in readme for command in block.commands()]
    assert any(text.startswith("python -m infersim --model") for text in commands)
    assert any(text.startswith("python -m infersim serve") for text in commands)
    assert "python -m infersim validate --summary" in commands
    shown = [command.text for block in CHECKED for command in block.commands()]
    assert "python -m infersim --config qwen3-30b.yaml" in shown  # the set-up command, explained in docs/cli.md


def test_every_command_shown_with_output_is_run_or_says_why_not() -> None:
    unannounced = [block.where for block in BLOCKS
                   if block.shows_a_command and not block.checked and not block.before.startswith(docs.NOT_RUN_MARK)]
    assert unannounced == [], f"tag them `console`, or announce them with a line starting {docs.NOT_RUN_MARK!r}"


def test_the_elisions_match_only_what_they_say() -> None:
    printed = ["header", "a 1.0 s", "b", "c", "footer"]
    assert docs.matches(["header", "...", "footer"], printed)
    assert docs.matches(["header", "a ...", "b", "c", "footer"], printed)
    assert docs.matches(["...", "c", "footer", ""], printed)  # trailing blank lines are not output
    assert not docs.matches(["header", "a 2.0 s", "b", "c", "footer"], printed)
    assert not docs.matches(["header", "...", "b", "footer ..."], printed[:-1])
    assert not docs.matches(["header", "...", "d", "..."], printed)
    assert not docs.matches(["header", "a ...", "b"], printed)  # no `...` line: every line is shown
    assert docs.normalised(f"read {docs.REPO}/engines/sglang.yaml  \n\n") == ["read .../engines/sglang.yaml"]
    assert docs.keeping_line_elisions(("x", "a ..."), ["a 2.0 s", "z"]) == ["a ...", "z"]


def test_field_tables_are_generated_from_the_schemas() -> None:
    page = docs.FIELD_TABLE_PAGE.read_text()
    for title, _ in docs.field_tables():
        assert title + "\n\n| field | type | meaning |" in page
    assert docs.with_field_tables(page) == page, REFRESH


def _help(words: list[str], runner: docs.Runner) -> str:
    """The --help of the deepest (sub)command the words name; the run command's for a plain run."""
    for depth in (2, 1, 0):
        head = words[:depth] if depth else ["run"]
        if depth and any(word.startswith("-") for word in head):
            continue
        text, status = runner.run("python -m infersim " + " ".join([*head, "--help"]))
        if status == 0:
            return text
    raise AssertionError(f"no --help for {words}")


def test_synopsis_commands_use_flags_that_exist(runner: docs.Runner) -> None:
    unknown = []
    for block in BLOCKS:
        if block.info != "bash":
            continue
        for line in block.body:
            command = line.split("#")[0].strip()
            if not command.startswith("python -m infersim"):
                continue
            words = command.split()[3:]
            known = _help(words, runner)
            unknown += [f"{block.where}: {flag} in {command!r}" for flag in
                        {word.split("=")[0] for word in words if word.startswith("--")} if flag not in known]
    assert unknown == []


def test_ci_runs_the_readme_test_command() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    shown = next(line.split("#")[0].strip() for line in readme.splitlines()
                 if "python -m pytest" in line and "pip install" in line)
    ci_lines = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd "))]
    ci = ci_lines[-1].replace("python -m pip", "pip").replace(" -q ", " ")  # the same command, quieter
    assert ci == shown


def test_the_readme_is_a_guide() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, "the README answers the three questions and links to docs/; the rest has a page there"
    assert "python -m infersim --config qwen3-30b.yaml" in "\n".join(lines)  # the set-up command


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation other than - and _ dropped, spaces as -."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_links_between_the_pages_resolve() -> None:
    broken = []
    for page in docs.PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_quoted_figures_are_what_their_commands_print(runner: docs.Runner) -> None:
    """Figures the prose quotes (scripts/quoted_figures.yaml) come from checked commands and agree
    with what those print now (those read from a command only a `console slow` block runs: the
    test below)."""
    problems = docs.figure_problems(runner, slow=False)
    assert problems == [], f"{REFRESH}\n" + "\n".join(problems)


@pytest.mark.slow
def test_quoted_figures_of_slow_commands_are_what_they_print(runner: docs.Runner) -> None:
    """The quotes the test above leaves out: their command (the full per-point `validate`) is checked
    under -m slow, as its block is."""
    quoted = docs.figure_problems(runner, slow=True)
    assert quoted == [], f"{REFRESH}\n" + "\n".join(quoted)


def test_a_drifted_quote_is_caught_and_rewritten() -> None:
    import quoted_figures

    quotes = [q for q in quoted_figures.load() if q.quote.startswith("against public measurements")]
    (quote,) = quotes
    output = {quote.command: "overall: 96 numbers compared, median |error| 3.5%"}
    page = "It is held\nagainst public measurements (97 compared numbers) that ship with it."

    def read(name: str) -> str:
        return page if name == quote.page else (quoted_figures.REPO / name).read_text()

    def output_of(command: str) -> str:
        return output.get(command, "")

    found = [p for p in quoted_figures.problems(output_of, {quote.command}, read) if p.startswith(quote.where)]
    assert found == [f"{quote.where}: the page says 97, the command prints 96"]
    fixed = quoted_figures.rewritten(quote.page, page, output_of)
    assert "against public measurements (96 compared numbers)" in fixed and "It is held\nagainst" in fixed
    # a quote whose command no checked block runs is refused
    assert any("is run by no checked console block" in p
               for p in quoted_figures.problems(output_of, set(), read) if p.startswith(quote.where))
