"""The ``rollout-mock`` command line.

Each subcommand lives in its own module under :mod:`rollout_mock.cli` and exposes two
functions: ``add_parser(subparsers)`` which registers its ``argparse`` parser, and
``run(args) -> int`` which returns the process exit code (a module of several commands,
:mod:`rollout_mock.cli.bundle`, has ``COMMANDS``: name -> the two functions). Expected failures (bad input files,
tolerances exceeded, ...) are reported as one clear message and a non-zero exit code, never as a
traceback. Finding the dump a read-only command was pointed at, and saying so when it is
elsewhere, is :func:`resolve_dump` (every command that reads a dump calls it).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout_mock.errors import DumpNotFoundError, RolloutMockError, dump_path_is_a_file
from rollout_mock.storage.manifest import MANIFEST_NAME
from rollout_mock.text import quiet_loggers, terminal_safe

#: Subcommand name -> module under ``rollout_mock.cli``.
COMMANDS: dict[str, str] = {
    "demo": "demo",
    "ls": "ls",
    "env": "env",
    "verify": "verify",
    "verify-resume": "verify",
    "diff": "diff",
    "import": "import_dump",
    "show": "show",
    "logprobs": "logprobs",
    "cut": "bundle",
    "report": "report",
    "explain": "report",
    "bisect": "bisect",
    "pack": "bundle",
    "unpack": "bundle",
    "pull": "bundle",
}


def find_dumps(root: Path, depth: int = 2) -> list[Path]:
    """Folders holding ``manifest.json`` one to ``depth`` levels below ``root``."""
    found: list[Path] = []
    level = [root]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
            except OSError:
                continue
            for child in children:
                (found if (child / MANIFEST_NAME).is_file() else below).append(child)
        level = below
    return found


def resolve_dump(location: str | Path, command: str, rest: str | Sequence[str] = "") -> str | Path:
    """``location`` when it holds a dump (an fsspec URL or a bundle is passed through as is: its
    store says); otherwise a DumpNotFoundError that says where dumps are (one or two levels down),
    or what kind of folder it is, with the command to run instead."""
    from rollout_mock.storage.bundle import is_bundle
    from rollout_mock.storage.paths import is_url
    from rollout_mock.storage.store import open_store

    if is_url(str(location)) or is_bundle(location):
        return str(location)
    path = Path(location)
    if (path / MANIFEST_NAME).is_file() or (path.is_dir() and open_store(path).has_dump()):
        return path
    if not path.exists():
        raise DumpNotFoundError(f"dump directory not found: no such folder: {path}", path=path)
    if not path.is_dir():
        raise dump_path_is_a_file(path)
    if not isinstance(rest, str):  # the arguments of the suggested command, each quoted for a shell
        rest = " ".join(shlex.quote(str(arg)) for arg in rest)
    suffix = f" {rest}" if rest else ""
    below = find_dumps(path)
    if below:
        listing = "; ".join(f"rollout-mock {command} {shlex.quote(str(p))}{suffix}" for p in below[:5])
        more = f" (and {len(below) - 5} more)" if len(below) > 5 else ""
        raise DumpNotFoundError(
            f"{path} is not a dump itself (no {MANIFEST_NAME}), but {len(below)} dump(s) are inside it{more}: "
            f"{listing}", path=path,
        )
    from rollout_mock.adapters.foreign import detect_format

    fmt = detect_format(path)
    if fmt is not None:
        raise DumpNotFoundError(
            f"{path} is a {fmt} dump, not a rollout_mock one (no {MANIFEST_NAME}); convert it once: "
            f"rollout-mock import {shlex.quote(str(path))} {shlex.quote(f'{path}_imported')} --trust  "
            f"(then: rollout-mock {command} {shlex.quote(f'{path}_imported')}{suffix})",
            path=path,
        )
    raise DumpNotFoundError(
        f"{path} holds no dump (no {MANIFEST_NAME} here or two levels below); pass the dump_dir "
        f"a dump-mode run wrote", path=path,
    )


_ROLE = re.compile(r":[a-z]+:`(~?)([^`<]+?)(?:\s*<[^>]*>)?`")


def plain_text(text: str) -> str:
    """reStructuredText markup of the docstrings the help texts are made of, as plain text:
    ``code`` -> code, :func:`~a.b` -> b, :class:`a.B` -> a.B, a literal block's ``::`` -> ``:``."""

    def role(match: re.Match[str]) -> str:
        target = match.group(2).strip()
        return target.rsplit(".", 1)[-1] if match.group(1) else target

    text = _ROLE.sub(role, text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.sub(r"(\S)::$", r"\1:", re.sub(r"\s+::$", "", text, flags=re.M), flags=re.M)


class _PlainHelp(argparse.HelpFormatter):
    def format_help(self) -> str:
        return plain_text(super().format_help())


class _PlainRawHelp(argparse.RawDescriptionHelpFormatter):
    def format_help(self) -> str:
        return plain_text(super().format_help())


def _plain_formatter(parser: argparse.ArgumentParser) -> None:
    """Help output without reStructuredText markup, keeping the parser's raw/wrapped choice."""
    kind = parser.formatter_class
    raw = isinstance(kind, type) and issubclass(kind, argparse.RawDescriptionHelpFormatter)
    parser.formatter_class = _PlainRawHelp if raw else _PlainHelp


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollout-mock",
        description="Record and replay RL rollout batches; verify that training numerics did not change.",
        formatter_class=_PlainHelp,
    )
    from rollout_mock.version import __version__

    _add_loudness(parser, default=False)
    parser.add_argument("--version", action="version", version=f"rollout-mock {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, module_name in COMMANDS.items():
        module = importlib.import_module(f"rollout_mock.cli.{module_name}")
        several = getattr(module, "COMMANDS", None)
        add, run = several[command] if several is not None else (module.add_parser, module.run)
        sub_parser = add(sub)
        sub_parser.set_defaults(_run=run, _parser=sub_parser)
        # -q / -v after the command too (`rollout-mock ls -q DUMP`); SUPPRESS keeps a value given
        # before the command when none is given after it
        _add_loudness(sub_parser, default=argparse.SUPPRESS)
        _plain_formatter(sub_parser)
    return parser


def _add_loudness(parser: argparse.ArgumentParser, *, default: Any) -> None:
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-v", "--verbose", action="store_true", default=default,
                          help="log at DEBUG level (every step)")
    loudness.add_argument("-q", "--quiet", action="store_true", default=default, help="log warnings and errors only")


class _SafeStream:
    """A text stream that writes everything through :func:`~rollout_mock.text.terminal_safe`:
    the CLI prints values read from dumps (keys, prompts, file names, manifest fields), which are
    untrusted; none of its own output uses control characters, so escaping every write is
    exact (JSON output never holds raw controls either: ``json`` escapes them). The one exception,
    progress bars (their carriage returns redraw the line), draw on :attr:`unescaped` and escape
    their own descriptions (:func:`rollout_mock.text.progress_bar`)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.unescaped = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal_safe(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer...
        return getattr(self._stream, name)


#: Third-party loggers kept at WARNING unless -v: object-store clients log at INFO.
_QUIET_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3fs", "fsspec", "urllib3", "gcsfs", "adlfs")


def _error_line(command: str, exc: BaseException) -> str:
    return f"rollout-mock {command}: error: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. The one exception boundary of the CLI: every
    :class:`~rollout_mock.errors.RolloutMockError` (and every ``OSError``: an unreadable,
    missing or forbidden file) ends in exit code 2 and one message on stderr, escaped like all
    output; anything else is a bug and keeps its traceback (hostile input is turned into
    RolloutMockError where it is parsed, never caught here by a blanket ``except``)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _SafeStream(sys.stdout), _SafeStream(sys.stderr)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's "unrecognized arguments" message, with the nearest option of ``parser`` for each
    misspelt one (``--agianst``: did you mean --against?)."""
    options = [name for action in parser._actions for name in action.option_strings if name.startswith("--")]
    hints = []
    for extra in extras:
        name = extra.partition("=")[0]
        if name.startswith("-") and name not in options:
            near = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
            if near:
                hints.append(f"did you mean {near[0]} (not {name})?")
    return "; ".join([f"unrecognized arguments: {' '.join(extras)}", *hints])


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # said by the command's own parser (its usage line), with the option meant
        command_parser = getattr(args, "_parser", parser)
        command_parser.error(unrecognized(command_parser, extras))
    if args.command is None:  # `rollout-mock` alone: say what it can do
        parser.print_help()
        print("\nstart with: rollout-mock demo   (records and replays a toy run, then verifies it)")
        return 0
    if args.verbose and args.quiet:  # one before the command, the other after it
        parser.error("-q/--quiet and -v/--verbose exclude each other")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
        format="%(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:  # the commands' INFO lines are ours; the S3 client's ("Found credentials...") are noise
        quiet_loggers(_QUIET_LOGGERS)
    try:
        return int(args._run(args))
    except RolloutMockError as exc:
        print(_error_line(args.command, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: what was kept or replayed is logged where it happened
        print(f"rollout-mock {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file missing, unreadable or forbidden: the user's environment
        print(_error_line(args.command, exc), file=sys.stderr)
        return 2
