"""The docs name only commands, options and files that exist.

Every command in README.md and the manual (docs/*.md but the result reports), in a code block or an inline code span, is
checked against what would run it: a `make` target against the Makefile, `fedcme SUB --option`
against the CLI's own parser, `python -m MODULE` against the importable modules, a script's options
against its argparse definitions, and `dvc`/`mlflow`/`prefect` subcommands and options against those
tools' own parsers. Every repository path a doc names in code (`flows/tracking/run.py`) exists.
Placeholders (NAME, <module>, ...) are ignored; options are what is checked.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The manual: README.md and docs/*.md but the result reports (docs/results*.md), whose commands name the
# commit they ran at.
DOCS = [ROOT / "README.md", *sorted(path for path in (ROOT / "docs").glob("*.md") if not path.name.startswith("results"))]
TOOLS = ("make", "fedcme", "python", "python3", "dvc", "mlflow", "prefect")
PATH = re.compile(r"^(?:\.\./)?(?:fedcme_core|flows|bench|tools|tests|configs|docs|\.ci|\.dvc)/[\w./-]*\w$")
OPTION = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def code_spans(text: str) -> list[tuple[int, str]]:
    """(line, text) of each code block line and each inline code span."""
    spans, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        for span in [line] if fenced else re.findall(r"`([^`]+)`", line):
            span = re.sub(r"\s+#.*$", "", span.strip())
            spans.append((number, span[2:] if span.startswith("$ ") else span))
    return spans


def commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, words) of each span that runs one of the project's tools, `.venv/bin/` and `VAR=x` aside."""
    found = []
    for number, span in code_spans(text):
        words = span.replace("\\", " ").split()
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words and (words[0].split("/")[-1] in TOOLS or re.match(r"^(bench|tools)/\w+\.py$", words[0])):
            found.append((number, [words[0].split("/")[-1] if "/bin/" in words[0] else words[0], *words[1:]]))
    return found


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))


@cache
def fedcme_options() -> dict[str, set[str]]:
    from flows.cli import build_parser

    subparsers = next(action for action in build_parser()._actions if action.__class__.__name__ == "_SubParsersAction")
    return {name: {option for action in parser._actions for option in action.option_strings}
            for name, parser in subparsers.choices.items()}


@cache
def tool_help(*words: str) -> str:
    """`tool words... --help`, from the venv's own executable."""
    executable = Path(sys.executable).with_name(words[0])
    result = subprocess.run([str(executable), *words[1:], "--help"], capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr if result.returncode == 0 else ""


def module_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""


def script_source(path: Path) -> str:
    """A script's source, with the bench's shared options (bench/common.py) where it uses them."""
    source = path.read_text(encoding="utf-8")
    if path.parent.name == "bench" and "import common" in source:
        source += (path.parent / "common.py").read_text(encoding="utf-8")
    return source


def problem(words: list[str]) -> str | None:
    """What is wrong with one documented command (None: it exists, with every option it names)."""
    tool, rest = words[0], words[1:]
    options = OPTION.findall(" ".join(rest))
    if tool == "make":
        missing = [target for target in rest if not target.startswith("-") and "=" not in target
                   and target not in make_targets()]
        return f"no make target {missing}" if missing else None
    if tool in ("python", "python3") and rest[:1] == ["-m"] and len(rest) > 1:
        module = rest[1]
        if module == "flows.cli":
            return problem(["fedcme", *rest[2:]])
        source = module_source(module)
        if not source:
            return f"no module {module}"
        missing = [option for option in options if f'"{option}"' not in source]
        return f"{module} has no option {missing}" if missing else None
    if tool in ("python", "python3") and rest and rest[0].endswith(".py"):
        return problem(rest)
    if tool.endswith(".py"):
        path = ROOT / tool
        if not path.is_file():
            return f"no script {tool}"
        missing = [option for option in options if f'"{option}"' not in script_source(path)]
        return f"{tool} has no option {missing}" if missing else None
    if tool == "fedcme":
        known = fedcme_options()
        if not rest or rest[0] not in known:
            return None if not rest or rest[0].startswith("-") else f"no fedcme command {rest[0]!r}"
        missing = [option for option in options if option not in known[rest[0]]]
        return f"fedcme {rest[0]} has no option {missing}" if missing else None
    if tool in ("dvc", "mlflow", "prefect"):
        sub = [word for word in rest if re.match(r"^[a-z][a-z-]*$", word)][: 2 if tool != "mlflow" else 1]
        text = tool_help(tool, *sub)
        if not text:
            return f"`{tool} {' '.join(sub)} --help` fails"
        missing = [option for option in options if option not in text]
        return f"{tool} {' '.join(sub)} has no option {missing}" if missing else None
    return None


def documented() -> list[tuple[str, list[str]]]:
    return [(f"{path.relative_to(ROOT)}:{number}", words) for path in DOCS
            for number, words in commands(path.read_text(encoding="utf-8"))]


def test_every_documented_command_and_option_exists():
    problems = [f"{where}: `{' '.join(words)}`: {found}" for where, words in documented()
                if (found := problem(words)) is not None]
    assert not problems, "\n".join(problems)


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        created = set(re.findall(r"^cat > (\S+)", text, re.MULTILINE))  # files a manual page writes itself
        for number, span in code_spans(text):
            for word in span.split():
                word = word.strip("(),;:'\"")
                if PATH.match(word) and not any(mark in word for mark in "<>*{}") and word not in created and \
                        not (path.parent / word if word.startswith("..") else ROOT / word).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {word}")
    assert not missing, "paths the docs name that do not exist:\n" + "\n".join(missing)


# ------------------------------------------------------------------------------- the checks, checked
def test_commands_are_read_from_blocks_and_spans_with_prompts_and_comments_aside():
    text = "Run `make run` or:\n```\n$ .venv/bin/fedcme train --experiment x   # a comment\nls -l\n```\n"

    assert commands(text) == [(1, ["make", "run"]), (3, ["fedcme", "train", "--experiment", "x"])]


@pytest.mark.parametrize("words, expected", [
    (["make", "no-such-target"], "no make target ['no-such-target']"),
    (["fedcme", "train", "--no-such-option"], "fedcme train has no option ['--no-such-option']"),
    (["fedcme", "nope"], "no fedcme command 'nope'"),
    (["python", "-m", "flows.no_such_module"], "no module flows.no_such_module"),
    (["tools/check_run.py", "--no-such-option"], "tools/check_run.py has no option ['--no-such-option']"),
    (["dvc", "metrics", "show", "--no-such-option"], "dvc metrics show has no option ['--no-such-option']"),
])
def test_a_wrong_command_is_named(words, expected):
    assert problem(words) == expected


def test_a_right_command_passes():
    assert problem(["make", "test"]) is None
    assert problem(["fedcme", "train", "--config", "params.yaml", "--experiment", "NAME"]) is None
