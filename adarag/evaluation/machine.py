"""A description of the machine numbers were measured on, written beside every result."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import torch


def machine() -> dict[str, Any]:
    """CPU model, cores, torch version and threads, load average when called, and the date."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "date": time.strftime("%Y-%m-%d"),
    }


def describe_machine(info: dict[str, Any]) -> str:
    """One line for a results table."""
    return (
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
        f"({info['torch_threads']} threads), load average {info['load_average']} at start, "
        f"{info['date']}."
    )


def describe_sittings(sittings: list[dict[str, Any]]) -> str:
    """One line for a table whose rows were measured in ``sittings`` (:func:`machine` dicts).

    A report rebuilt later from stored rows names the machines and loads its rows were measured
    under, not the moment it was written.
    """
    if len(sittings) == 1:
        return describe_machine(sittings[0])
    machines = dict.fromkeys(
        f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} "
        f"({info['torch_threads']} threads)"
        for info in sittings
    )
    loads = sorted(info["load_average"] for info in sittings if info["load_average"] is not None)
    dates = sorted({info["date"] for info in sittings})
    load = f"load average {loads[0]} to {loads[-1]} at their starts" if loads else "load unknown"
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"Machine: {'; '.join(machines)}; {len(sittings)} measuring runs, {load}, {when}."
