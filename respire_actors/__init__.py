"""respire_actors: a job queue and reliable message queue on Redis Streams, built as supervised
actors on anyio, running unchanged under trio or asyncio.

See README.md and docs/ for the guide; every public name is re-exported here.
"""

from .codecs import BytesCodec, Codec, DecodeError, EncodeError, JsonCodec, StrCodec
from .embedded import EmbeddedConfig, open_embedded_server, run_embedded_server
from .errors import (
    CommandTimeout,
    ConfigurationError,
    EmbeddedServerError,
    PermissionDenied,
    RedisUnavailable,
    RespireError,
    ScriptError,
    ServerError,
    TransactionAborted,
    UnsupportedServer,
    ValidationError,
    WrongKeyType,
)
from .jobs import (
    ACK,
    NACK,
    Ack,
    DeadLetter,
    DeadLetterReason,
    EnqueueResult,
    Job,
    JobEvent,
    JobQueue,
    LogPolicy,
    Nack,
    Outcome,
    Worker,
    WorkerOptions,
    WorkerStatistics,
)
from .redis import ConnectionSettings, Pending, RedisClient, ServerInfo, Transaction, connect
from .reliable import Message, MessageDecodeError, ReliableQueue, ReliableTopic, Subscription
from .streams import StreamEntry, StreamWorker, StreamWorkerOptions

__version__ = "0.1.0"

__all__ = [
    "StreamWorkerOptions",
    "StreamWorker",
    "StreamEntry",
    "Subscription",
    "ReliableTopic",
    "ReliableQueue",
    "MessageDecodeError",
    "Message",
    "ACK",
    "NACK",
    "Ack",
    "BytesCodec",
    "Codec",
    "CommandTimeout",
    "ConfigurationError",
    "ConnectionSettings",
    "DeadLetter",
    "DeadLetterReason",
    "DecodeError",
    "EmbeddedConfig",
    "EmbeddedServerError",
    "EncodeError",
    "EnqueueResult",
    "Job",
    "JobEvent",
    "JobQueue",
    "JsonCodec",
    "LogPolicy",
    "Nack",
    "Outcome",
    "Pending",
    "PermissionDenied",
    "RedisClient",
    "RedisUnavailable",
    "RespireError",
    "ScriptError",
    "ServerError",
    "ServerInfo",
    "StrCodec",
    "Transaction",
    "TransactionAborted",
    "UnsupportedServer",
    "ValidationError",
    "Worker",
    "WorkerOptions",
    "WorkerStatistics",
    "WrongKeyType",
    "__version__",
    "connect",
    "open_embedded_server",
    "run_embedded_server",
]
