"""README.md's flag tables are generated from the parser (scripts/render-flags) and match it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpuledger.cli.flags import (
    FLAG_TABLE_COMMANDS,
    build_parser,
    flag_reference,
    readme_with_flag_tables,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def _flags(command: str) -> list[argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        a
        for a in sub.choices[command]._actions
        if a.option_strings and a.help != argparse.SUPPRESS and "--help" not in a.option_strings
    ]


def test_readme_tables_are_up_to_date() -> None:
    text = README.read_text()
    assert readme_with_flag_tables(text, build_parser()) == text, (
        "README.md's flag tables are stale: run scripts/render-flags"
    )


@pytest.mark.parametrize("command", FLAG_TABLE_COMMANDS)
def test_every_flag_is_in_the_readme_with_a_meaning(command: str) -> None:
    text = README.read_text()
    for action in _flags(command):
        flag = max(action.option_strings, key=len)
        assert f"| `{flag}` |" in text, f"{command} {flag} missing from README.md"
        assert (action.help or "").strip(), f"{command} {flag} has no help text"


def test_every_serve_flag_names_its_variable_in_help_and_table() -> None:
    rows = flag_reference(build_parser(), "serve")
    for action in _flags("serve"):
        env = getattr(action, "gpuledger_env", None)
        assert env, f"serve {action.option_strings} has no GPULEDGER_ variable"
        assert f"GPULEDGER_{env}" in (action.help or "")
        assert any(f"`GPULEDGER_{env}`" in row for row in rows)


def test_a_stale_table_is_rewritten_in_place() -> None:
    stale = "intro\n<!-- flags:serve -->\n| old |\n<!-- /flags -->\nmid\n"
    stale += "<!-- flags:explain -->\n<!-- /flags -->\nend\n"
    fresh = readme_with_flag_tables(stale, build_parser())
    assert "| old |" not in fresh
    assert "`--ray-address`" in fresh and "`--gpu`" in fresh
    assert fresh.startswith("intro\n") and fresh.endswith("end\n") and "\nmid\n" in fresh
