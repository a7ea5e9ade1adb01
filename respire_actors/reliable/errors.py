"""Errors specific to reliable queues and topics (all part of the respire_actors tree)."""

from __future__ import annotations

from ..codecs import DecodeError
from ..errors import ScriptError


class MessageDecodeError(DecodeError):
    """The codec could not decode a received payload.

    The whole batch stays leased: it is redelivered after its visibility timeout and counts
    toward the delivery limit, so an undecodable message ends in the dead letters. ``message_id``
    names the first failing message, ``batch_ids`` the whole leased batch.
    """

    def __init__(self, message: str, *, message_id: str, batch_ids: tuple[str, ...]) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.batch_ids = batch_ids


class SubscriptionNotFound(ScriptError):
    """The topic has no subscription of that name: create it with ``create_subscription``."""


__all__ = ["MessageDecodeError", "SubscriptionNotFound"]
