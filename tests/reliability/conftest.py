"""The reliability suite: each test injects a fault or hostile input and records what happened.

``make test`` runs it at a small size; ``make reliability`` sets ``ADARAG_RELIABILITY=full``
(longer soak, more fuzz examples, more crash points) and ``ADARAG_RELIABILITY_REPORT=<dir>``,
where the session writes ``faults.json``/``faults.md`` (the per-fault-class table) and
``soak.json``.

Every test collected here carries the ``reliability`` marker, so ``make test-fast`` can leave the
suite out (``-m "not reliability"``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

FULL = os.environ.get("ADARAG_RELIABILITY") == "full"
HERE = Path(__file__).resolve().parent

settings.register_profile(
    "reliability-fast",
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "reliability-full",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def scale(fast: int, full: int) -> int:
    """A size: ``fast`` under ``make test``, ``full`` under ``make reliability``."""
    return full if FULL else fast


@dataclass
class FaultRow:
    """One fault or input class: cases tried, detected, wrong answers served, data lost."""

    cases: int = 0
    detected: int = 0
    wrong_answers: int = 0
    data_lost: int = 0


class FaultLedger:
    """Counts per fault class, across the session."""

    def __init__(self) -> None:
        self.rows: dict[str, FaultRow] = {}
        self.extra: dict[str, Any] = {}

    def record(
        self,
        fault_class: str,
        *,
        cases: int = 1,
        detected: int | None = None,
        wrong_answers: int = 0,
        data_lost: int = 0,
    ) -> None:
        """Add ``cases`` tried (all detected unless ``detected`` says otherwise)."""
        row = self.rows.setdefault(fault_class, FaultRow())
        row.cases += cases
        row.detected += cases if detected is None else detected
        row.wrong_answers += wrong_answers
        row.data_lost += data_lost

    def write(self, directory: Path) -> None:
        """``faults.json``, ``faults.md`` and one JSON file per extra figure set."""
        directory.mkdir(parents=True, exist_ok=True)
        rows = {name: asdict(row) for name, row in sorted(self.rows.items())}
        (directory / "faults.json").write_text(json.dumps(rows, indent=2) + "\n")
        lines = [
            "| fault or input class | cases tried | detected | wrong answers served | data lost |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, row in sorted(self.rows.items()):
            lines.append(
                f"| {name} | {row.cases} | {row.detected} | {row.wrong_answers} | {row.data_lost} |"
            )
        (directory / "faults.md").write_text("\n".join(lines) + "\n")
        for name, figures in self.extra.items():
            (directory / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")


_LEDGER = FaultLedger()


@pytest.fixture(scope="session")
def ledger() -> FaultLedger:
    """The session's fault ledger (written at the end when a report directory is set)."""
    return _LEDGER


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("reliability-full" if FULL else "reliability-fast")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The hook sees the whole session's items: mark only this folder's, before `-m` selects.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.reliability)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    report = os.environ.get("ADARAG_RELIABILITY_REPORT")
    if report and _LEDGER.rows:
        _LEDGER.write(Path(report))
