"""The Redis connection layer: the only code that talks to coredis."""

from .client import (
    BlockingConnection,
    ConnectionSettings,
    Pending,
    RedisClient,
    ServerInfo,
    Transaction,
    connect,
)

__all__ = [
    "BlockingConnection",
    "ConnectionSettings",
    "Pending",
    "RedisClient",
    "ServerInfo",
    "Transaction",
    "connect",
]
