"""Crash-loop isolation: a delivery suspected of crashing its worker runs alone.

A handler that kills its process (a segfaulting extension, an out-of-memory kill, ``os._exit``)
never reports an outcome; recovery delivers its job again, and every job that was running beside
it in the dead process too, each one delivery closer to its limit. Run together again, the
poison would take its neighbours with it into the dead letters.

So a delivery whose count reaches :func:`suspect_from` (its earlier deliveries ended with no
outcome that reset the count: a crash, a lost lease, or a failure left for recovery) is a
suspect and runs **alone** in its registration:

- recovery claims it in a page of its own (``job_claim_pending`` ends a page before a suspect
  and right after one), so no other entry is charged a delivery along with it;
- dispatching it holds every other admission back
  (:meth:`~respire_actors.actors.admission.Admission.hold_back`), and its runner waits until
  the handlers beside it have finished and no other suspect runs
  (:meth:`~respire_actors.actors.admission.Admission.wait_alone`): nothing else is read,
  claimed or started until it ends; suspects claimed at once (the reader's recover claim and
  the sweeper's) run one after the other, and one still waiting when the worker stops is
  not started.

The poison then crashes alone and reaches the delivery limit by itself; its former neighbours,
suspects too, run one at a time and finish. The wait happens under the delivery's lease
(renewed meanwhile) and before its execution budget starts. Failures that should be retried
without isolation use a retry backoff (``QueueOptions``): a durable retry is a new delivery
whose count starts again at 1.
"""

from __future__ import annotations

SUSPECT_FROM = 3
"""The delivery count from which a delivery runs alone (with a delivery limit of 4 or more):
the first redelivery (count 2) is usually an ordinary crash, a deploy or an outage; a second
one without an outcome in between points at the job itself."""


def suspect_from(delivery_limit: int) -> int:
    """The delivery count from which a delivery runs alone, for a delivery limit (0: none):
    :data:`SUSPECT_FROM`, or 2 when the limit is 3 or less (isolated before its last attempt);
    with a limit of 1 nothing is ever redelivered (pure)."""
    if delivery_limit and delivery_limit <= 3:
        return 2
    return SUSPECT_FROM
