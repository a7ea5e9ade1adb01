"""The tests' synchronous RESP2 client: the chaos suite's admin client (one implementation)."""

from respire_actors.chaos.admin import RespError, SyncRedis, info_fields
from respire_actors.redis.client import ConnectionSettings

__all__ = ["RespError", "SyncRedis", "info_fields", "sync_redis_for"]


def sync_redis_for(url: str, *, timeout: float = 5.0) -> SyncRedis:
    """A SyncRedis on the server of ``url``, authenticated and on the URL's database."""
    settings = ConnectionSettings.from_url(url)
    conn = (
        SyncRedis(unix_path=settings.unix_socket_path, timeout=timeout)
        if settings.unix_socket_path
        else SyncRedis(settings.host, settings.port, timeout=timeout)
    )
    try:
        if settings.password is not None:
            if settings.username:
                conn.execute("AUTH", settings.username, settings.password)
            else:
                conn.execute("AUTH", settings.password)
        if settings.db:
            conn.execute("SELECT", settings.db)
    except BaseException:
        conn.close()
        raise
    return conn
