"""Check the commands and outputs of the README and the docs against the current code.

::

    python -m tests.readme                         # check every document; a diff per stale block
    python -m tests.readme docs/offline-planning.md   # check one document
    python -m tests.readme --update                # rewrite the documents' outputs from the code
    pytest tests/test_readme.py                    # the same check, one test per block

The documents are ``README.md``, every page of the docs site (``docs/**/*.md``) and
``benchmarks/README.md`` (``DOCUMENTS``). Blocks are marked with an HTML comment on the line
before their opening fence:

- ``<!-- readme: run -->``: a transcript. Every ``$ command`` line runs in bash, in one scratch
  directory per document (shared by that document's blocks, in their order); what it prints
  (stdout and stderr together) must equal the lines under it, up to timings (``solved in
  0.52 s``). The scratch directory holds links to the real profiles
  (``$PERSEUS_TEST_PROFILES``, else ``../shared/data/profiles``); a block whose commands name
  one that is absent is skipped.
- ``<!-- readme: file NAME -->``: the block is file ``NAME`` as the commands above left it.
- ``<!-- readme: keys NAME -->``: a shortened JSON file: every ``"key":`` it shows is a key of
  JSON file ``NAME`` (at any depth), every key of the file is shown, and every number shown
  right after a key (``"key": 1.25``; not inside a list) is one the file holds under that key,
  to the digits shown.
- ``<!-- readme: synopsis COMMAND -->``: every ``--option`` in it is an option of
  ``perseus COMMAND``.
- ``<!-- readme: recorded -->``: output of a run that needs a GPU, torch, a server or minutes
  (training, benchmarks); shown as measured, not checked here.

Unmarked ``sh`` blocks are checked without running them: every ``perseus ...`` command in them
parses with the current command line, and every ``pip install`` names this distribution or a
checkout (``.``) with extras that exist. A plain block that shows a ``$ perseus`` prompt must be
marked.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
BENCHMARKS_README = REPO / "benchmarks" / "README.md"
PROFILES = Path(
    os.environ.get("PERSEUS_TEST_PROFILES") or REPO.parent / "shared" / "data" / "profiles"
)
PROFILE_NAMES = ("bloom+a100_sxm_bf16.csv", "bloom+a40_bf16.csv", "gpt3-175b+a40_bf16.csv")


def documents() -> list[Path]:
    """Every document whose blocks are checked: the README, the docs pages, the benchmarks'."""
    found = [README, *sorted(DOCS.rglob("*.md"))]
    if BENCHMARKS_README.is_file():
        found.append(BENCHMARKS_README)
    return found


def _name(document: Path) -> str:
    try:
        return document.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(document)


_MARKER = re.compile(r"^<!-- readme: (\w+)(?: (.*?))? -->$")
_TIMING = re.compile(r"(solved in |planned in )\d+(?:\.\d+)? s")


@dataclass
class Block:
    """A fenced block of a document: lines ``start``..``end`` (the fences excluded)."""

    start: int
    end: int
    language: str
    marker: str | None
    argument: str | None
    lines: list[str]
    document: Path = README

    @property
    def where(self) -> str:
        return f"{_name(self.document)}:{self.start}"


@dataclass
class Outcome:
    """What checking one block found."""

    block: Block
    actual: list[str] | None = None  # a transcript's output as the code prints it now
    skipped: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        return self.actual is not None and _normal(self.actual) != _normal(self.block.lines)


def blocks(text: str, document: Path = README) -> list[Block]:
    """Every fenced block of ``text`` (the text of ``document``) with its marker."""
    lines = text.split("\n")
    found = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            language = lines[i][3:].strip()
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            previous = lines[i - 1].strip() if i else ""
            marker = _MARKER.match(previous)
            found.append(
                Block(
                    start=i + 2,
                    end=j,
                    language=language,
                    marker=marker.group(1) if marker else None,
                    argument=marker.group(2) if marker else None,
                    lines=lines[i + 1 : j],
                    document=document,
                )
            )
            i = j
        i += 1
    return found


def check(readme: Path = README) -> Iterator[Outcome]:
    """Check every block of document ``readme``; its transcripts run in one scratch directory,
    in order."""
    with tempfile.TemporaryDirectory(prefix="perseus-readme-") as scratch:
        work = Path(scratch)
        for name in PROFILE_NAMES:
            if (PROFILES / name).is_file():
                (work / name).symlink_to(PROFILES / name)
        for block in blocks(readme.read_text(), readme):
            yield _check_block(block, work)


def _check_block(block: Block, work: Path) -> Outcome:
    outcome = Outcome(block)
    if block.marker == "run":
        commands = [line[2:] for line in block.lines if line.startswith("$ ")]
        missing = [
            name
            for name in PROFILE_NAMES
            if any(name in c for c in commands) and not (work / name).exists()
        ]
        if missing:
            outcome.skipped = f"real profile {missing[0]} not in {PROFILES}"
            return outcome
        outcome.actual = []
        for command in commands:
            outcome.actual.append(f"$ {command}")
            outcome.actual += _run(command, work)
    elif block.marker == "file":
        path = work / str(block.argument)
        if not path.is_file():
            outcome.problems.append(f"{block.argument} was not written by the commands above")
        else:
            outcome.actual = path.read_text().rstrip("\n").split("\n")
    elif block.marker == "keys":
        outcome.problems += _check_keys(block, work / str(block.argument))
    elif block.marker == "synopsis":
        outcome.problems += _check_synopsis(block)
    elif block.marker == "recorded":
        pass
    elif block.marker is not None:
        outcome.problems.append(f"unknown marker {block.marker!r}")
    elif block.language == "sh":
        outcome.problems += _check_shell(block)
    elif any(line.startswith("$ perseus") for line in block.lines):
        outcome.problems.append("shows a '$ perseus' prompt but has no readme marker")
    return outcome


def _run(command: str, work: Path) -> list[str]:
    env = dict(os.environ)
    # The perseus of this interpreter's environment, whatever PATH says.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout.rstrip("\n")
    return output.split("\n") if output else []


def _normal(lines: list[str]) -> list[str]:
    return [_TIMING.sub(r"\1<t> s", line).rstrip() for line in lines]


def _check_keys(block: Block, path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path.name} was not written by the commands above"]
    text = "\n".join(block.lines)
    shown = set(re.findall(r'"(\w+)"\s*:', text))
    real: set[str] = set()
    numbers: dict[str, list[float]] = {}  # every number the file holds under each key

    def walk(value: object, key: str | None = None) -> None:
        if isinstance(value, dict):
            real.update(value)
            for name, item in value.items():
                walk(item, name)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)
        elif isinstance(value, int | float) and not isinstance(value, bool) and key:
            numbers.setdefault(key, []).append(float(value))

    walk(json.loads(path.read_text()))
    problems = []
    if shown - real:
        problems.append(f"shows keys {path.name} lacks: {', '.join(sorted(shown - real))}")
    if real - shown:
        problems.append(f"leaves out keys of {path.name}: {', '.join(sorted(real - shown))}")
    # A number shown under a key must be one the file holds there, to the digits shown.
    for key, shown_number in re.findall(r'"(\w+)"\s*:\s*(-?\d+(?:\.\d+)?)\b(?!\.)', text):
        digits = len(shown_number.partition(".")[2])
        half = 0.5 * 10.0**-digits * (1 + 1e-9)
        if not any(abs(v - float(shown_number)) <= half for v in numbers.get(key, [])):
            problems.append(f'shows "{key}": {shown_number}, which {path.name} does not hold')
    return problems


def _check_synopsis(block: Block) -> list[str]:
    from perseus.cli import command_parser

    words = str(block.argument).split()
    parser = command_parser(words[0])
    if len(words) > 1:  # e.g. "job create": the subcommand's own parser
        parser = _subparser(parser, words[1])
    known = set(parser._option_string_actions)
    used = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", "\n".join(block.lines)))
    return [f"perseus {block.argument}: no option {option}" for option in sorted(used - known)]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)


def _check_shell(block: Block) -> list[str]:
    text = "\n".join(block.lines).replace("\\\n", " ")
    problems = []
    for line in text.split("\n"):
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for command in _commands(line):
            problems += _check_command(command)
    return problems


def _commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line: split at && ; | & and inside $(...)."""
    inner = re.findall(r"\$\(([^()]*)\)", line)
    outer = re.sub(r"\"?\$\([^()]*\)\"?", "X", line)
    commands = []
    for part in [*re.split(r"&&|;|\|+|&(?!&)", outer), *inner]:
        try:
            words = shlex.split(part)
        except ValueError:
            continue
        while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
            words.pop(0)
        if words:
            commands.append(words)
    return commands


def _check_command(words: list[str]) -> list[str]:
    if words[0] == "perseus" and len(words) > 1:
        from perseus.cli import command_parser
        from perseus.cli.arguments import UsageError

        shown = shlex.join(words)
        try:
            command_parser(words[1]).parse_args(words[2:])
        except UsageError as err:
            return [f"{shown}: {err}"]
        except SystemExit as exited:
            return [f"{shown}: exits {exited.code}"]
        return []
    if words[:2] == ["pip", "install"]:
        return _check_install([w for w in words[2:] if not w.startswith("-")])
    return []


def _check_install(targets: list[str]) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    problems = []
    for target in targets:
        name, _, rest = target.partition("[")
        wanted = {e for e in rest.rstrip("]").split(",") if e}
        if name not in (".", project["name"]) and not name.startswith(("torch==", "uvicorn")):
            problems.append(f"pip install {target}: not {project['name']!r} or a checkout '.'")
        if name in (".", project["name"]) and wanted - extras:
            problems.append(f"pip install {target}: no extra {', '.join(sorted(wanted - extras))}")
    return problems


def update(readme: Path = README) -> int:
    """Rewrite every transcript and file block of ``readme`` with what the current code prints.

    Returns:
        The number of blocks changed.
    """
    lines = readme.read_text().split("\n")
    changed = 0
    # Bottom up, so that earlier line numbers stay valid while later blocks are replaced.
    for outcome in reversed(list(check(readme))):
        if outcome.stale and outcome.actual is not None:
            lines[outcome.block.start - 1 : outcome.block.end] = outcome.actual
            changed += 1
    readme.write_text("\n".join(lines))
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Check or regenerate the outputs of the README and the docs."
    )
    parser.add_argument("--update", action="store_true", help="rewrite stale output blocks")
    parser.add_argument(
        "documents", nargs="*", type=Path, help="documents to check (default: all of them)"
    )
    args = parser.parse_args()
    chosen = [path.resolve() for path in args.documents] or documents()
    failed = 0
    for document in chosen:
        if args.update:
            print(f"updated {update(document)} blocks of {_name(document)}")
        for outcome in check(document):
            block = outcome.block
            if outcome.skipped:
                print(f"{block.where}: skipped: {outcome.skipped}")
            for problem in outcome.problems:
                print(f"{block.where}: {problem}")
                failed += 1
            if outcome.stale and outcome.actual is not None:
                failed += 1
                print(f"{block.where}: stale output:")
                diff = difflib.unified_diff(
                    block.lines, outcome.actual, _name(document), "current code", lineterm="", n=1
                )
                print("\n".join(diff))
    print("documents: all checked blocks agree" if not failed else f"documents: {failed} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
