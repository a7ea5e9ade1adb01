"""The tests' synchronous RESP2 client: the chaos suite's admin client (one implementation)."""

from respire_actors.chaos.admin import RespError, SyncRedis, info_fields

__all__ = ["RespError", "SyncRedis", "info_fields"]
