"""The operator API: queue discovery, paged inspection, dead-letter retry and safe retention.

::

    from respire_actors.admin import QueueAdmin, list_queues

    for name in await list_queues(client):
        print(await QueueAdmin(client, name).summary())

See docs/admin-api.md.
"""

from ..registry import list_queues, register_queue, unregister_queue
from ..retention import TrimGroup, TrimPlan, TrimResult, TrimStream
from .model import (
    DeadLetterPage,
    DeadLetterRow,
    EventPage,
    JobDetail,
    PendingPage,
    PendingRow,
    QueueSummary,
    RetryProgress,
    ScheduledPage,
    ScheduledRow,
)
from .queue_admin import QueueAdmin

__all__ = [
    "DeadLetterPage",
    "DeadLetterRow",
    "EventPage",
    "JobDetail",
    "PendingPage",
    "PendingRow",
    "QueueAdmin",
    "QueueSummary",
    "RetryProgress",
    "ScheduledPage",
    "ScheduledRow",
    "TrimGroup",
    "TrimPlan",
    "TrimResult",
    "TrimStream",
    "list_queues",
    "register_queue",
    "unregister_queue",
]
