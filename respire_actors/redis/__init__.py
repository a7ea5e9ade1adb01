"""The Redis connection layer: the only code that talks to Redis (anyio streams + hiredis)."""

from .client import (
    BlockingConnection,
    ConnectionSettings,
    ConnectionStatistics,
    Pending,
    RedisClient,
    ServerInfo,
    Transaction,
    connect,
)

__all__ = [
    "BlockingConnection",
    "ConnectionSettings",
    "ConnectionStatistics",
    "Pending",
    "RedisClient",
    "ServerInfo",
    "Transaction",
    "connect",
]
