"""The machine line of a results table: one run, or the runs its rows were measured in."""

from __future__ import annotations

from adarag.evaluation.machine import describe_machine, describe_sittings, machine


def _sitting(load: float, date: str = "2026-12-07", cpu: str = "Xeon") -> dict:
    return {**machine(), "cpu": cpu, "load_average": load, "date": date}


def test_one_run_is_described_as_the_machine_it_ran_on() -> None:
    info = _sitting(1.5)
    assert describe_sittings([info]) == describe_machine(info)


def test_several_runs_give_their_count_load_range_and_dates() -> None:
    line = describe_sittings(
        [_sitting(2.3, "2026-12-07"), _sitting(0.4, "2026-12-08"), _sitting(1.1, "2026-12-07")]
    )
    assert "3 measuring runs" in line
    assert "load average 0.4 to 2.3" in line
    assert "2026-12-07 to 2026-12-08" in line


def test_runs_on_different_machines_name_each_machine_once() -> None:
    line = describe_sittings([_sitting(1.0, cpu="Xeon"), _sitting(1.0, cpu="EPYC"), _sitting(2.0)])
    assert line.count("Xeon") == 1 and line.count("EPYC") == 1
