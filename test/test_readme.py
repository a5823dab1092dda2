"""The README is a user's manual that cannot grow back or drift from the CLI: at most
20 KB, the sections a user looks for, every `adaptive-dynamics` command in its code
blocks a real subcommand with options its `--help` lists, and every link of the README
and docs/ pointing at a file (and heading) that exists."""
from __future__ import annotations

import contextlib
import functools
import io
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from adaptive_dynamics import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXE = [sys.executable, "-m", "adaptive_dynamics.cli"]
MAX_BYTES = 20 * 1024
SECTIONS = ("What it does", "Two commands", "Your robot", "Live tuning", "Record, replay, identify", "The systems")


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def _commands(text: str) -> list[list[str]]:
    """Each `adaptive-dynamics ...` invocation of the code blocks and of the inline code
    as argv after the program name (continuation lines joined, comments and shell
    substitutions dropped)."""
    out = []
    inline = re.findall(r"(?<!`)`((?:\./dev run )?adaptive-dynamics [^`]+)`", re.sub(r"^```.*?^```", "", text,
                                                                                   flags=re.S | re.M))
    for block in _code_blocks(text) + inline:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if not re.match(r"(\./dev run )?adaptive-dynamics ", line):
                continue
            rest = line.split("adaptive-dynamics ", 1)[1]
            rest = re.sub(r"\$\([^)]*\)|\$\w+", "X", rest)
            out.append(shlex.split(rest))
    return out


@functools.lru_cache(maxsize=None)
def _help_of(argv: tuple) -> str:
    return _help(list(argv))


def _help(argv: list[str]) -> str:
    """``adaptive-dynamics ARGV --help``'s text, in process (the entry point itself is
    test_cli's; a fresh interpreter per command only re-imported the same modules)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ex:
        cli.main(argv + ["--help"])
    assert ex.value.code in (0, None), (argv, ex.value.code)
    return out.getvalue()


def test_readme_is_a_manual_of_at_most_20_kb():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= MAX_BYTES, f"README.md is {len(text.encode())} bytes (bound {MAX_BYTES})"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for s in SECTIONS:
        assert s in headings, (s, headings)
    assert "./dev demo" in text and "./dev test" in text


def test_every_command_of_the_readme_exists_with_its_options():
    cmds = _commands(README.read_text(encoding="utf-8"))
    assert len(cmds) >= 10, cmds
    top = _help([])
    checked = set()
    listed = None
    for argv in cmds:
        if argv[0].startswith("-"):      # `adaptive-dynamics --help`
            continue
        sub = argv[0]
        assert re.search(rf"\b{re.escape(sub)}\b", top), f"`adaptive-dynamics {sub}` is not a subcommand"
        key = argv[:2] if sub == "experiment" else argv[:1]
        if sub == "experiment":
            if listed is None:
                listed = subprocess.run(EXE + ["experiment", "--list"], capture_output=True, text=True,
                                        cwd=ROOT).stdout
            assert re.search(rf"\b{re.escape(argv[1])}\b", listed), f"no experiment {argv[1]!r}: {listed}"
        opts = {a.split("=")[0] for a in argv if a.startswith("--")}
        if (tuple(key), frozenset(opts)) in checked:
            continue
        checked.add((tuple(key), frozenset(opts)))
        text = _help_of(tuple(key))
        for o in opts:
            assert re.search(rf"(^|[\s,\[]){re.escape(o)}\b", text), f"`adaptive-dynamics {' '.join(key)}` has no {o}"


def _anchors(path: pathlib.Path) -> set[str]:
    out, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            t = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            out.add(t)
    return out


@pytest.mark.parametrize("doc", [README] + sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_links_point_at_files_and_headings_that_exist(doc):
    bad = []
    for link in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
        if link.startswith(("http://", "https://")):
            continue
        path, _, frag = link.partition("#")
        target = doc if not path else (doc.parent / path)
        if not target.exists():
            bad.append(link)
        elif frag and target.suffix == ".md" and frag not in _anchors(target):
            bad.append(link)
    assert not bad, bad
