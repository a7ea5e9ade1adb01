"""Typed job queues and their supervised workers."""

from ..actors.runtime import WorkerStatistics
from .backpressure import Backlog
from .batches import BatchStatus, Callback
from .flows import (
    CONTINUE,
    FAIL_PARENT,
    IGNORE,
    FlowFailurePolicy,
    FlowNode,
    FlowNodeResult,
    FlowStatus,
)
from .groups import GroupInfo, GroupOptions, GroupPage
from .job import Job
from .metrics import MinuteMetrics, read_metrics
from .model import (
    ACK,
    NACK,
    Ack,
    Complete,
    DeadLetter,
    DeadLetterReason,
    Delivery,
    EnqueueResult,
    JobEvent,
    JobStatus,
    Nack,
    Outcome,
    QueueState,
    RetryAfter,
)
from .options import (
    JobEnqueueOptions,
    LogPolicy,
    QueueOptions,
    RateLimit,
    Retention,
    WorkerOptions,
)
from .partitioned import PartitionedBacklog, PartitionedJobQueue, PartitionedQueueState
from .partitioning import partition_names, partition_of
from .queue import JobQueue
from .recurring import (
    CATCH_UP,
    SKIP,
    MissedTickPolicy,
    RecurringOptions,
    RecurringScheduler,
    ScheduleInfo,
    SchedulePage,
)
from .worker import Registration, Worker

__all__ = [
    "Backlog",
    "CONTINUE",
    "FAIL_PARENT",
    "IGNORE",
    "FlowFailurePolicy",
    "FlowNode",
    "FlowNodeResult",
    "FlowStatus",
    "ACK",
    "CATCH_UP",
    "SKIP",
    "MissedTickPolicy",
    "RecurringOptions",
    "RecurringScheduler",
    "ScheduleInfo",
    "SchedulePage",
    "NACK",
    "Ack",
    "BatchStatus",
    "Callback",
    "DeadLetter",
    "DeadLetterReason",
    "Delivery",
    "EnqueueResult",
    "GroupInfo",
    "GroupOptions",
    "GroupPage",
    "Job",
    "JobEnqueueOptions",
    "JobEvent",
    "JobQueue",
    "PartitionedJobQueue",
    "PartitionedBacklog",
    "PartitionedQueueState",
    "partition_names",
    "partition_of",
    "JobStatus",
    "LogPolicy",
    "Nack",
    "Outcome",
    "QueueOptions",
    "QueueState",
    "RateLimit",
    "Registration",
    "Retention",
    "RetryAfter",
    "Complete",
    "MinuteMetrics",
    "read_metrics",
    "Worker",
    "WorkerOptions",
    "WorkerStatistics",
]
