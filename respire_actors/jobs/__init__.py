"""Typed job queues and their supervised workers."""

from .model import (
    ACK,
    NACK,
    Ack,
    DeadLetter,
    DeadLetterReason,
    Delivery,
    EnqueueResult,
    JobEvent,
    Nack,
    Outcome,
)
from .options import LogPolicy, WorkerOptions
from .queue import JobQueue
from .runtime import Job, WorkerStatistics
from .worker import Registration, Worker

__all__ = [
    "ACK",
    "NACK",
    "Ack",
    "DeadLetter",
    "DeadLetterReason",
    "Delivery",
    "EnqueueResult",
    "Job",
    "JobEvent",
    "JobQueue",
    "LogPolicy",
    "Nack",
    "Outcome",
    "Registration",
    "Worker",
    "WorkerOptions",
    "WorkerStatistics",
]
