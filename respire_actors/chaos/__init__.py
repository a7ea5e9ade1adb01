"""The failure contract as a runnable chaos suite (seed 004, "Test the failure contract").

Each scenario drives real worker processes against real servers, injects one kind of failure
(SIGKILL at a kill point, SIGSTOP past the claim threshold, a failover, a restore, ...) and then
reconciles what producers were told was accepted against what Redis and the handlers' effect
ledgers say happened. The result is a :class:`Verdict` per case, printed as a table and written as
JSON and markdown. Run it with ``python -m respire_actors chaos`` (see docs/failure-contract.md).
"""

from .ledger import Ledger, read_ledger
from .model import ChaosContext, Scenario, Verdict
from .reconcile import Outcomes, read_outcomes, reconcile

__all__ = [
    "ChaosContext",
    "Ledger",
    "Outcomes",
    "Scenario",
    "Verdict",
    "read_ledger",
    "read_outcomes",
    "reconcile",
]
