"""goodlens: goodput observability for large distributed training runs.

This package holds what does not depend on HTTP or the browser: the data model, units and
durations, the trace format and the command-line interface that wires the parts together.
"""

__version__ = "0.1.0"
