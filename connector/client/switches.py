"""$LEDGER_* switches that are on by default, apart from what they switch so that reading one imports nothing."""
from __future__ import annotations

import os

OFF_VALUES = ("off", "0", "false", "no")


def switched_off(variable: str) -> bool:
    """Whether the environment turns off a LEDGER_* switch that is on by default (off, 0, false or no)."""
    return os.environ.get(variable, "").strip().lower() in OFF_VALUES
