"""A launch plan as text (shell commands to copy) and as JSON (each command as a list of arguments)."""

from __future__ import annotations

import json
import re
import textwrap
from typing import Any

from infersim.launch.plan import Command, LaunchPlan, Setting

WIDTH = 100
_SAFE = re.compile(r"^[A-Za-z0-9_./:=@%+,-]+$")
_EXPANDED = re.compile(r"^[A-Za-z0-9_./:=@%+,$-]+$")  # a $PLACEHOLDER the shell is meant to expand


def shell_word(word: str) -> str:
    """A word as the shell takes it: bare where safe, in double quotes where it holds a $PLACEHOLDER to
    expand, else in single quotes."""
    if _SAFE.match(word):
        return word
    if _EXPANDED.match(word):
        return f'"{word}"'
    return "'" + word.replace("'", "'\"'\"'") + "'"


def _groups(words: list[str]) -> list[list[str]]:
    """Words grouped as a reader takes them: each flag with its values (a negative number is a value)."""
    groups: list[list[str]] = []
    for word in words:
        if not groups or re.match(r"^--?[A-Za-z]", word):
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


def command_text(command: Command, indent: str = "    ") -> list[str]:
    """The command as shell lines: options files first (a here-document each), then the command, a
    flag and its values kept together where they fit, wrapped with backslashes."""
    lines: list[str] = []
    for file in command.files:
        lines.append(f"{indent}cat > {file.name} <<'EOF'")
        lines.extend(f"{indent}{line}" for line in file.text.rstrip("\n").split("\n"))
        lines.append(f"{indent}EOF")
    env = [f"{name}={shell_word(value)}" for name, value in command.env]
    program = len(env) + 1  # the environment and the program's first word start the command
    words = env + [shell_word(word) for word in command.argv]
    current = ""
    for group in [words[:program]] + _groups(words[program:]):
        text = " ".join(group)
        if current and len(indent) + len(current) + len(text) + 3 > WIDTH:
            lines.append(indent + current + " \\")
            current = "  "
        for word in group if len(text) > WIDTH - len(indent) - 4 else [text]:
            if current.strip() and len(indent) + len(current) + len(word) + 3 > WIDTH:
                lines.append(indent + current + " \\")
                current = "  "
            current = f"{current} {word}" if current.strip() else current + word
    lines.append(indent + current)
    return lines


def _setting_text(s: Setting) -> str:
    value = s.value
    if isinstance(value, (list, tuple)):
        value = f"{value[0]}..{value[-1]} ({len(value)} sizes)" if len(value) > 4 else " ".join(map(str, value))
    elif isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, dict):
        value = json.dumps(value, separators=(",", ":"))
    return f"{s.fact}: {s.argument}={value}"


def _wrapped(label: str, items: list[str]) -> list[str]:
    if not items:
        return []
    return textwrap.wrap("; ".join(items), width=WIDTH, initial_indent=f"  {label:<9} ", subsequent_indent=" " * 12,
                         break_on_hyphens=False, break_long_words=False)


def plan_text(plan: LaunchPlan) -> str:
    """Each command, then what its server's flags realise: set on the command, or left at an engine
    default equal to the simulation's; then the notes."""
    out = [f"LAUNCH  {plan.label + ': ' if plan.label else ''}{plan.engine}: {plan.parser}"]
    shown: set[str] = set()
    for command in plan.commands:
        out.append(f"  {command.role}{', on ' + command.where if command.where else ''}:")
        out.extend(command_text(command))
        if command.role in shown:
            continue
        shown.add(command.role)
        mine = [s for s in plan.settings if s.role == command.role]
        out += _wrapped("set:", [_setting_text(s) for s in mine if s.how == "set"])
        out += _wrapped("defaults:", [_setting_text(s) for s in mine if s.how == "default"])
    for note in plan.notes:
        out.extend(textwrap.wrap(note, width=WIDTH, initial_indent="  note:     ", subsequent_indent=" " * 12,
                                 break_on_hyphens=False, break_long_words=False))
    return "\n".join(out)


def plan_json(plan: LaunchPlan) -> dict[str, Any]:
    return {
        "engine": plan.engine,
        "parser": plan.parser,
        **({"label": plan.label} if plan.label else {}),
        "commands": [{"role": c.role, "where": c.where, "env": dict(c.env), "argv": list(c.argv),
                      "files": [{"name": f.name, "text": f.text} for f in c.files]} for c in plan.commands],
        "settings": [{"fact": s.fact, "value": list(s.value) if isinstance(s.value, tuple) else s.value,
                      "argument": s.argument, "how": s.how, **({"role": s.role} if s.role else {})}
                     for s in plan.settings],
        "notes": list(plan.notes),
    }
