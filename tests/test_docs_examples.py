"""The README and docs work verbatim: their code blocks are extracted from the Markdown and run.

- The README's Quick start: its Python block is saved under the name its first line gives,
  and the shell block after it is run line by line in that folder (the worker in the
  background until the run is done, then stopped with Ctrl-C, as a user would), against a
  loopback server standing in for the PaaS.
- Every other ```python block in README.md and docs/ must at least compile; a block marked
  ``<!-- excerpt: PATH -->`` just before it must still be the code in PATH.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
from pathlib import Path

import anyio
import pytest

import durable

from .conftest import ROOT, subprocess_env
from .httpserver import Rule, loopback_server

pytestmark = pytest.mark.anyio

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*excerpt:\s*(?P<excerpt>\S+)\s*-->\s*\n)?```(?P<lang>\w*)\n"
                   r"(?P<body>.*?)```", re.S)


def blocks(path: Path) -> list[tuple[str, str, str | None]]:
    """(language, body, excerpted file or None) of every fenced block in a Markdown file."""
    return [(m["lang"], m["body"], m["excerpt"])
            for m in BLOCK.finditer(path.read_text(encoding="utf-8"))]


def section(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    assert heading in text, f"{path.name} has no {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def shell_lines(body: str) -> list[tuple[list[str], str]]:
    """Each command of a shell block as argv, with the comment written after it."""
    out = []
    for line in body.splitlines():
        command, _, comment = line.partition("  #")
        if command.strip():
            out.append((shlex.split(command), comment.strip()))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_block_compiles(doc: Path) -> None:
    for lang, body, excerpt in blocks(doc):
        if lang != "python":
            continue
        compile(body, f"{doc.name} block", "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
        if excerpt:
            source = (ROOT / excerpt).read_text(encoding="utf-8")
            for line in body.splitlines():
                code = line.split("#", 1)[0].strip()
                assert not code or code in source, f"{doc.name}: {code!r} is not in {excerpt}"


async def test_quick_start_runs_verbatim(tmp_path: Path) -> None:
    quick = section(ROOT / "README.md", "## Quick start")
    found = blocks_of(quick)
    python = next(body for lang, body in found if lang == "python")
    shell = next(body for lang, body in found if lang == "sh")
    name = python.splitlines()[0].lstrip("# ").strip()
    assert name.endswith(".py"), "the Quick start's Python block names its file on line 1"
    (tmp_path / name).write_text(python, encoding="utf-8")
    commands = shell_lines(shell)
    assert [argv[:3] for argv, _ in commands] == [
        ["python", name], ["python", "-m", "durable.worker"], ["python", "-m", "durable"]]

    env = subprocess_env()
    env.pop("DURABLE_DB", None)
    env.pop("DURABLE_IMPORT", None)
    async with loopback_server() as paas:
        paas.on("/api/v1/databases/db-123", Rule(status=204, body=None))
        env["PAAS_URL"] = paas.url

        def argv(words: list[str]) -> list[str]:
            return [sys.executable, *words[1:]] if words[0] == "python" else words

        # 1. the script queues the run (and only when run as a script)
        first, comment = commands[0]
        done = await anyio.run_process(argv(first), cwd=tmp_path, env=env, check=False)
        assert done.returncode == 0, done.stderr.decode()
        expected = re.search(r'prints "([^"]+)"', comment)
        assert expected and done.stdout.decode().strip() == expected[1]

        # 2. the worker runs it, until Ctrl-C
        worker_argv, comment = commands[1]
        assert "Ctrl-C" in comment
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            worker = await anyio.open_process(argv(worker_argv), cwd=tmp_path, env=env,
                                              stdout=out, stderr=out)
        try:
            url = "sqlite:///" + str(tmp_path / "durable.db")
            async with durable.Client.connect(url, create=False) as client:
                with anyio.fail_after(30):  # a bounded poll, failing at once if the worker dies
                    while not (run := await client.get("teardown-slot-7")).state.finished:
                        assert worker.returncode is None, log.read_text()
                        await anyio.sleep(0.05)
            assert run.state is durable.RunState.COMPLETED, log.read_text()
            assert [(r.method, r.path) for r in paas.seen()] == [
                ("DELETE", "/api/v1/databases/db-123")]
            worker.send_signal(signal.SIGINT)
            with anyio.fail_after(20):
                code = await worker.wait()
            assert code == 0, log.read_text()
        finally:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
            await worker.aclose()
        assert "Traceback" not in log.read_text()

        # 3. show prints the run and its journal
        shown = await anyio.run_process(argv(commands[2][0]), cwd=tmp_path, env=env,
                                        check=False)
        assert shown.returncode == 0, shown.stderr.decode()
        text = shown.stdout.decode()
        assert "teardown-slot-7" in text and "completed" in text
        assert "database db-123: deleted" in text


def blocks_of(markdown: str) -> list[tuple[str, str]]:
    return [(m["lang"], m["body"]) for m in BLOCK.finditer(markdown)]



def test_readme_command_line_lists_every_command_and_option() -> None:
    import argparse

    from durable._cli import build_parser, worker_parser

    text = section(ROOT / "README.md", "### Command line")
    common = {"--db", "--traceback", "--backend", "--help", "-h"}

    def options(parser: argparse.ArgumentParser) -> set[str]:
        return {flag for action in parser._actions for flag in action.option_strings
                if flag.startswith("--")} - common

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"python -m durable {name}" in text, name
        if name != "worker":
            for flag in options(parser):
                assert flag in text, f"README's command line block lacks {name} {flag}"
    for flag in options(worker_parser()):
        assert flag in text, f"README's command line block lacks worker {flag}"
    for flag in common - {"-h"}:
        assert flag in text
