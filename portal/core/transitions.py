"""The one generic rule of every lifecycle: a move must be in its state machine's table.

The tables and the functions that move versions, deployments and instances live with their
models, in ``portal/registry/lifecycle.py`` and ``portal/deployments/lifecycle.py``.
"""

from __future__ import annotations

from portal.core.errors import InvalidTransition


def check_transition(
    table: dict[str, frozenset[str]], what: str, current: str, target: str
) -> None:
    if target not in table:
        raise InvalidTransition(f"{target!r} is not a {what} state.")
    if target not in table[current]:
        allowed = ", ".join(sorted(table[current])) or "none: it is final"
        raise InvalidTransition(
            f"A {what} cannot go from {current} to {target} (allowed from {current}: {allowed})."
        )
