"""Recipe: per-step fault tolerance with torchft (``examples/ft/scenario.py``).

- ``torchft``: three replica groups (one torchrun each, one gloo rank per group) and a hot
  spare under one torchft lighthouse; ``g1`` killed mid-step (it heals from a peer and
  rejoins), ``g2`` slowed and evicted by the collector's ``/v1/actions`` while the others
  go on, the spare ``g3`` joining in its place.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.harness import ROOT
from tests.record import Capture, recipe, script_module, timeline

#: torchft: the scenario's settings (``train_ft.py``'s defaults unless passed)
FT = {"groups": 3, "nproc": 1, "steps": 200, "step_s": 0.05, "slow_s": 0.3, "batch": 8,
      "killed": "g1", "slow": "g2", "spare": "g3", "min_confidence": 0.7, "min_groups": 2}


def ft_scenario() -> ModuleType:
    """``examples/ft/scenario.py`` as a module."""
    return script_module("ft_scenario", ROOT / "examples" / "ft" / "scenario.py")


@recipe("torchft")
def torchft(tmp: Path) -> Capture:
    sc = ft_scenario().FTScenario(tmp, "ft", nproc=FT["nproc"], steps=FT["steps"],
                                  step_s=FT["step_s"], timeout_s=400)
    try:
        summary = sc.run()
    finally:
        sc.stop()
    return Capture(Path(summary["db"]), "ft", tmp / "truth",
                   {"settings": FT, "exit_codes": summary["exit_codes"],
                    "timeline": timeline(summary, "group")})
