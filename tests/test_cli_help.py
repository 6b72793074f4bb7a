"""CLI help: every option explained with its default, valid values listed, nothing ignored."""

from __future__ import annotations

import argparse
import re

import pytest

from durable import RunState
from durable._cli import build_parser, worker_parser

from .test_cli import assert_one_line_error, cli

COMMANDS = ["start", "list", "show", "cancel", "signal", "pause", "resume", "paused",
            "replay", "approve", "reject", "schedule", "prune", "migrate", "console", "worker"]
SCHEDULE_ACTIONS = ["add", "list", "show", "pause", "resume", "delete"]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def every_parser() -> dict[str, argparse.ArgumentParser]:
    top = build_parser()
    commands = subparsers(top)
    return {"durable": top, **{f"durable {n}": p for n, p in commands.items()},
            **{f"durable schedule {n}": p for n, p in subparsers(commands["schedule"]).items()},
            "python -m durable.worker": worker_parser()}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_subcommand_is_listed_with_a_one_line_help() -> None:
    top = build_parser()
    assert list(subparsers(top)) == COMMANDS
    [action] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in action._choices_actions}
    assert set(helps) == set(COMMANDS) and all(helps.values()), helps
    text = top.format_help()
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s+\S", text, re.M), (name, text)
    assert "``" not in text and ":class:" not in text and ":func:" not in text
    assert list(subparsers(subparsers(top)["schedule"])) == SCHEDULE_ACTIONS


@pytest.mark.parametrize("name", list(every_parser()))
def test_every_option_has_help_and_shows_its_default(name: str) -> None:
    parser = every_parser()[name]
    text = " ".join(parser.format_help().split())
    for action in options(parser):
        assert action.help and action.help.strip(), (name, action.dest)
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        formatter = parser._get_formatter()
        shown = formatter._get_help_string(action) % {"default": action.default,
                                                       "prog": parser.prog}
        if action.default not in (None, False, argparse.SUPPRESS):
            assert "(default:" in shown, (name, action.dest, shown)
        if action.choices is not None:  # valid values are listed in the usage and help
            assert "{" + ",".join(map(str, action.choices)) + "}" in text, (name, action.dest)
        assert " ".join(shown.split()) in text


def test_valid_values_are_choices() -> None:
    parsers = subparsers(build_parser())
    [state] = [a for a in parsers["list"]._actions if a.dest == "state"]
    assert list(state.choices or []) == [s.value for s in RunState]
    for worker in (parsers["worker"], worker_parser()):
        by_dest = {a.dest: a for a in worker._actions}
        assert list(by_dest["backend"].choices or []) == ["asyncio", "trio"]
        assert list(by_dest["log_format"].choices or []) == ["console", "json"]


def test_options_a_command_would_ignore_are_refused(tmp_path: object) -> None:
    # --console-url only makes links in recovery reports (show, and the worker's messages)
    ignored = {"migrate": ["--console-url", "--import"], "list": ["--console-url"],
               "cancel": ["--console-url"], "replay": ["--console-url"],
               "start": ["--console-url"]}
    for command, flags in ignored.items():
        dests = {o for a in subparsers(build_parser())[command]._actions
                 for o in a.option_strings}
        for flag in flags:
            assert flag not in dests, (command, flag)
    result = cli("migrate", "--console-url", "http://x", db="sqlite:///unused.db")
    assert result.returncode == 2
    assert_one_line_error(result, "unrecognized arguments: --console-url",
                          "durable migrate --help")


def test_traceback_is_accepted_by_every_command() -> None:
    for name, parser in every_parser().items():
        if name in ("durable", "durable schedule"):
            continue
        flags = {o for a in parser._actions for o in a.option_strings}
        assert "--traceback" in flags, name
