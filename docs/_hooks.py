"""MkDocs hooks: generate the reference pages from the code at build time.

``docs/configuration.md`` and ``docs/cli.md`` hold hand-written prose and one placeholder line
each (an HTML comment, see ``PLACEHOLDERS``). At build time the placeholder is replaced with a
reference generated from the code:

* the configuration reference from the pydantic model ``rollout_mock.RolloutMockConfig``
  (``model_fields``: name, type, default, constraints, description; nested models get their
  own table, with dotted names);
* the CLI reference from the ``argparse`` parser of ``rollout-mock``
  (``rollout_mock.cli.build_parser``), one section per subcommand.

Nothing generated is committed, so the reference cannot drift from the code. The generated
Markdown is wrapped in ``<!-- generated:NAME start/end -->`` comments, which survive into the
HTML (``tests/unit/test_docs_build.py`` reads them). A page whose placeholder is missing, or a
model or parser that cannot be imported, fails the build.
"""

from __future__ import annotations

import argparse
import ast
import enum
import inspect
import json
import os
import re
import textwrap
import types
import typing
from typing import Any

from mkdocs.exceptions import PluginError

PLACEHOLDERS = {
    "configuration.md": ("<!-- generated:config-reference -->", "config-reference"),
    "cli.md": ("<!-- generated:cli-reference -->", "cli-reference"),
}


# --------------------------------------------------------------------------- text helpers
def _rst_to_md(text: str) -> str:
    """The docstrings use reST roles and double backticks; Markdown wants single backticks."""
    role = r":(?:class|func|meth|attr|mod|exc|data):`~?([^`]+)`"
    text = re.sub(role, lambda m: f"`{m.group(1).split('.')[-1]}`", text)
    return text.replace("``", "`")


def _one_line(text: str) -> str:
    return " ".join(_rst_to_md(text).split())


def _cell(text: str) -> str:
    return _one_line(text).replace("|", "\\|")


# --------------------------------------------------------------------------- configuration
def _attribute_docstrings(cls: type) -> dict[str, str]:
    """``name: T = value`` followed by a string literal, in the class and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins", "pydantic.main") or klass.__module__.startswith("pydantic."):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, body[1:]):
            target = None
            if isinstance(node, ast.AnnAssign):
                target = node.target
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            if (
                isinstance(target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[target.id] = inspect.cleandoc(following.value.value)
    return docs


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "model_fields") and hasattr(tp, "model_config")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        parts = [_type_name(a) for a in args if a is not type(None)]
        if type(None) in args:
            parts.append("null")
        return " | ".join(parts)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) if isinstance(a, str) else str(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in tp)
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _yaml_value(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z0-9_./-]+", value) else json.dumps(value)
    return json.dumps(value, default=str)


def _default(field: Any) -> tuple[bool, Any]:
    """(has_default, default)."""
    if field.is_required():
        return False, None
    if field.default_factory is not None:
        try:
            return True, field.default_factory()
        except TypeError:  # factories that take the validated data
            return True, None
    return True, field.default


def _constraints(field: Any) -> str:
    names = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "min length", "max_length": "max length"}
    found = []
    for item in field.metadata:
        for attr, label in names.items():
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{label} {value}")
    return ", ".join(found)


def _enum_doc(tp: Any) -> str:
    """For an enum-typed field without its own description: the enum's and its members' docs."""
    candidates = [tp, *typing.get_args(tp)]
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            parts = [inspect.getdoc(candidate) or ""] if candidate.__doc__ else []
            members = _attribute_docstrings(candidate)
            for member in candidate:
                if member.name in members:
                    parts.append(f"`{member.value}`: {members[member.name]}")
            return " ".join(p for p in parts if p)
    return ""


def _nested_models(tp: Any) -> list[type]:
    if _is_model(tp):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _nested_models(arg)]


def _model_tables(model: type, prefix: str, out: list[str], yaml_lines: list[str], indent: int) -> None:
    docs = _attribute_docstrings(model)
    nested: list[tuple[str, type]] = []
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}"
        description = field.description or docs.get(name, "") or _enum_doc(field.annotation)
        constraints = _constraints(field)
        if constraints:
            description = f"{description} ({constraints})" if description else f"({constraints})"
        has_default, default = _default(field)
        models = _nested_models(field.annotation)
        default_text = "*required*" if not has_default else f"`{_yaml_value(default)}`"
        if models and has_default and _is_model(type(default)):
            default_text = "see below"
        rows.append(
            f'| <span id="{key.replace(".", "-")}"></span>`{name}` | `{_one_line(_type_name(field.annotation))}` '
            f"| {default_text} | {_cell(description) or '&nbsp;'} |"
        )
        if models:
            yaml_lines.append(" " * indent + f"{name}:")
            nested.extend((f"{key}", m) for m in models)
            if _is_model(type(default)):
                _yaml_defaults(type(default), yaml_lines, indent + 2)
            else:
                yaml_lines[-1] += f" {_yaml_value(default) if has_default else ''}".rstrip()
        else:
            yaml_lines.append(" " * indent + f"{name}: {_yaml_value(default) if has_default else '# required'}")
    heading = "###" if prefix.count(".") == 0 else "####"
    out.append(f"{heading} `{prefix}`")
    out.append("")
    doc = inspect.getdoc(model)
    if doc and prefix.count(".") > 0:
        out.append(_rst_to_md(doc))
        out.append("")
    out.extend(rows)
    out.append("")
    for key, sub in nested:
        _model_tables(sub, key, out, [], indent)


def _yaml_defaults(model: type, lines: list[str], indent: int) -> None:
    for name, field in model.model_fields.items():
        has_default, default = _default(field)
        if _is_model(type(default)):
            lines.append(" " * indent + f"{name}:")
            _yaml_defaults(type(default), lines, indent + 2)
        else:
            lines.append(" " * indent + f"{name}: {_yaml_value(default) if has_default else '# required'}")


def config_reference() -> str:
    from rollout_mock import RolloutMockConfig

    tables: list[str] = []
    yaml_lines = ["rollout_mock:"]
    _model_tables(RolloutMockConfig, "rollout_mock", tables, yaml_lines, 2)
    out = [
        "## Every option",
        "",
        f"Generated from `RolloutMockConfig` ({len(RolloutMockConfig.model_fields)} options) when "
        "this site was built. Every key is optional; these are the defaults:",
        "",
        "```yaml",
        *yaml_lines,
        "```",
        "",
        *tables,
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI
def _load_parser() -> argparse.ArgumentParser:
    import importlib

    cli = importlib.import_module("rollout_mock.cli")
    for name in ("build_parser", "make_parser", "get_parser", "_build_parser", "create_parser"):
        factory = getattr(cli, name, None)
        if callable(factory):
            return factory()
    parser = getattr(cli, "parser", None)
    if isinstance(parser, argparse.ArgumentParser):
        return parser
    raise PluginError("rollout_mock.cli has no build_parser(): cannot generate the CLI reference")


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            result = []
            for name, sub in action.choices.items():
                if id(sub) in seen:  # aliases
                    continue
                seen.add(id(sub))
                result.append((name, helps.get(name, ""), sub))
            return result
    return []


def _usage(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_usage().strip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | meaning | default |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                names = (action.metavar if isinstance(action.metavar, tuple)
                         else (action.metavar or action.dest.upper(),))
                metavar = " " + " ".join(names)
            name = ", ".join(f"`{opt}{metavar}`" for opt in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}`"
        help_text = action.help or ""
        if "%(" in help_text:
            try:
                help_text = help_text % {**vars(action), "prog": parser.prog}
            except (KeyError, TypeError, ValueError):
                pass
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            help_text += f" (choices: {', '.join(str(c) for c in action.choices)})"
        if isinstance(action, argparse._AppendAction):
            help_text += " (repeatable)"
        default = action.default
        show_default = (
            action.option_strings
            and "default" not in help_text
            and action.nargs != 0
            and default not in (None, argparse.SUPPRESS, [], "")
        )
        rows.append(f"| {name} | {_cell(help_text) or '&nbsp;'} | {f'`{default}`' if show_default else ''} |")
    return rows if len(rows) > 2 else []


def cli_reference() -> str:
    parser = _load_parser()
    out = ["## Commands", "", "| command | what it does |", "|---|---|"]
    commands = _subcommands(parser)
    for name, help_text, _ in commands:
        out.append(f"| [`{name}`](#{name}) | {_cell(help_text)} |")
    out += ["", "Global options (before the command):", "", *_arguments_table(parser), ""]
    for name, help_text, sub in commands:
        out += [f"## `rollout-mock {name}` {{#{name}}}", ""]
        out += ["```text", _usage(sub), "```", ""]
        description = sub.description or help_text
        if description:
            out += [_rst_to_md(inspect.cleandoc(description)), ""]
        out += _arguments_table(sub)
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- mkdocs hooks
GENERATORS = {"config-reference": config_reference, "cli-reference": cli_reference}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    if src not in PLACEHOLDERS:
        return markdown
    placeholder, name = PLACEHOLDERS[src]
    if placeholder not in markdown:
        raise PluginError(f"docs/{src}: the placeholder {placeholder} is missing")
    try:
        generated = GENERATORS[name]()
    except PluginError:
        raise
    except Exception as exc:  # an import or model error must fail the build, loudly
        raise PluginError(f"docs/{src}: generating {name} failed: {type(exc).__name__}: {exc}") from exc
    block = f"<!-- generated:{name} start -->\n\n{generated}\n\n<!-- generated:{name} end -->"
    return markdown.replace(placeholder, block)
