"""Every option is declared once (key, parser, default, doc), and its declaration, its use and
docs/configuration.md agree."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from engine.config import WRITE_KEYS, WriteConfig, describe_options
from engine.errors import InvalidOptionError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"

NOT_READ = {
    "clean_async": "hoodie.clean.async is accepted under Hudi's name and documented as having "
                   "no effect: the streaming job always cleans in its service thread",
}
"""Declared options no code reads, each with the reason it is still accepted."""


def _source(*, skip: tuple[str, ...] = ()) -> str:
    parts = []
    for package in ("engine", "ingest", "jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if str(path.relative_to(ROOT)) not in skip:
                parts.append(path.read_text())
    return "\n".join(parts)


def _doc_table_keys(heading: str) -> list[str]:
    text = DOC.read_text()
    start = text.index(heading)
    table = text[text.index("| key |", start):text.index("\n\n", text.index("| key |", start))]
    return re.findall(r"^\| `([^`]+)`", table, re.M)


def test_write_config_fields_are_the_declared_options_with_their_defaults() -> None:
    declared = {spec.attr: spec for spec in WRITE_KEYS}
    defaults = WriteConfig()
    for f in fields(WriteConfig):
        if f.name == "extra":
            continue
        assert f.name in declared, f"WriteConfig.{f.name} has no option declaration"
        assert f.default is not MISSING
        assert f.default == declared[f.name].default == getattr(defaults, f.name), f.name
    names = [k for spec in WRITE_KEYS for k in (spec.key, *spec.aliases)]
    assert len(names) == len(set(names)), "an option key or alias is declared twice"
    assert all(spec.doc and spec.group in ("writer", "services") for spec in WRITE_KEYS)


def test_every_declared_write_option_is_read() -> None:
    source = _source(skip=("engine/config.py",))
    unread = [spec.attr for spec in WRITE_KEYS
              if spec.attr not in NOT_READ and not re.search(rf"\.{spec.attr}\b", source)]
    assert unread == []
    assert all(attr in {s.attr for s in WRITE_KEYS} for attr in NOT_READ)


@pytest.mark.parametrize(("heading", "group"), [("## Writer options", "writer"),
                                                ("## Table services", "services")])
def test_docs_list_exactly_the_declared_write_options(heading: str, group: str) -> None:
    assert describe_options(WRITE_KEYS, group) in DOC.read_text()
    assert _doc_table_keys(heading) == [s.key for s in WRITE_KEYS if s.group == group]


def test_bad_write_option_error_names_the_option() -> None:
    for spec in WRITE_KEYS:
        for key in (spec.key, *spec.aliases):
            try:
                WriteConfig.from_options({key: "\x00 not a value"})
            except InvalidOptionError as exc:
                assert exc.key == key and f"'{key}'" in str(exc)
