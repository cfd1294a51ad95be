"""Which CPU plans a compute ran: a backend's kept plans before, against the plans its
later computes run (whether something bound them ahead, e.g. a warm-up's prepare)."""

from __future__ import annotations

from typing import Any


def kept_plans(cpu: Any) -> set[int]:
    """The ids of the plans a CPU backend keeps now."""
    return {id(plan) for plan in cpu._plans.values()}


def record_runs(cpu: Any) -> list[int]:
    """A list that gets the id of every plan the CPU backend ``cpu`` runs from now on."""
    ran: list[int] = []
    run = cpu._run

    def recorded(plan: Any) -> Any:
        ran.append(id(plan))
        return run(plan)

    cpu._run = recorded
    return ran
