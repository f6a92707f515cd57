"""The one conversion of values leaving the library: plain Python for JSON, reports and UIs.

Frames and arrays carry numpy scalars, NaN, ``pd.NA`` and ``NaT`` for missing values; JSON
(the HTTP API, ``--json``, trace metadata, webhooks) wants ``None``, ``int``, ``float``,
``str``, lists and dicts. Every layer converts through :func:`plain` (or :func:`records` for
a frame, :func:`dumps` for text) so "missing" is spelled one way everywhere. Duck-typed: it
imports neither numpy nor pandas, so the model layer stays light.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

_MISSING_TYPES = frozenset({"NAType", "NaTType"})


def is_missing(value: Any) -> bool:
    """True for None, NaN (Python or numpy), ``pd.NA`` and ``pd.NaT``."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    if type(value).__name__ in _MISSING_TYPES:
        return True
    if hasattr(value, "dtype") and hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        v = value.item()
        return isinstance(v, float) and math.isnan(v)
    return False


def plain(value: Any) -> Any:
    """``value`` as plain Python: missing values and non-finite floats as None, numpy scalars
    and arrays as Python numbers and lists, dataclasses and mappings as dicts, tuples and
    sets as lists (recursively)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if type(value).__name__ in _MISSING_TYPES:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {str(k) if not isinstance(k, (str, int)) else k: plain(v)
                for k, v in value.items()}
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalar or array
        return plain(value.tolist())
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if hasattr(value, "isoformat"):  # datetime, pd.Timestamp
        return value.isoformat()
    return value


def records(frame: Any) -> list[dict[str, Any]]:
    """A DataFrame's rows as plain dicts (missing values as None)."""
    return [{k: plain(v) for k, v in row.items()}
            for row in frame.astype(object).to_dict("records")]


def dumps(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON text, converted by :func:`plain` (never NaN tokens)."""
    return json.dumps(plain(value), indent=indent, allow_nan=False,
                      separators=None if indent else (",", ":"))
