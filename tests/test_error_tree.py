"""Every exception class tidelake defines is under ``TidelakeError``, with its retry intent."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from engine.errors import TerminalError, TidelakeError, TransientError

ROOT = Path(__file__).resolve().parents[1]


def _exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for package in ("engine", "ingest", "jobs"):
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if (isinstance(value, type) and issubclass(value, BaseException)
                        and value.__module__ == module.__name__):
                    found.append(value)
    return found


def test_every_error_class_is_under_the_root_and_terminal_or_transient() -> None:
    classes = _exception_classes()
    assert len(classes) > 20
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes
               if not issubclass(c, TidelakeError)]
    assert outside == []
    undecided = [f"{c.__module__}.{c.__qualname__}" for c in classes
                 if c is not TidelakeError and not issubclass(c, TerminalError | TransientError)
                 and c.__name__ != "InvalidOptionError"]
    assert undecided == []


def test_one_missing_topic_error() -> None:
    from ingest import kafka_check, kafka_source

    assert kafka_check.MissingTopicsError is kafka_source.MissingTopicsError
    assert not hasattr(kafka_source, "KafkaTopicNotFoundError")
