"""Stream workers: supervised consumers of application-owned streams."""

from .worker import (
    StreamEntry,
    StreamHandler,
    StreamRegistration,
    StreamSource,
    StreamWorker,
    StreamWorkerOptions,
    validate_start_id,
)

__all__ = [
    "StreamEntry",
    "StreamHandler",
    "StreamRegistration",
    "StreamSource",
    "StreamWorker",
    "StreamWorkerOptions",
    "validate_start_id",
]
