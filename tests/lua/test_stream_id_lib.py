"""lib/stream_id.lua: stream ids as fixed-width text whose text order is stream id order, and
back (also for ids beyond 2^53, where Lua numbers lose digits)."""

from __future__ import annotations

import pytest

from respire_actors.redis import scripts
from respire_actors.redis.client import RedisClient

pytestmark = pytest.mark.anyio

MAX = "18446744073709551615"  # 2^64 - 1: the largest ms and seq of a stream id
BIG = "1700000000000-9007199254740993"  # seq 2^53 + 1: not a double
IDS = ["0-0", "0-1", "5-9", "5-10", "9-99", "10-0", BIG, f"{MAX}-{MAX}"]


async def lua(client: RedisClient, body: str, *args: str) -> list[str]:
    source = scripts._read("lib/stream_id.lua") + body
    reply = await client.execute("EVAL", source, 0, *args)
    return [r.decode() if isinstance(r, bytes) else r for r in reply]


async def test_sortable_ids_have_fixed_width_and_stream_id_order(client: RedisClient) -> None:
    body = "local out = {}\nfor i, id in ipairs(ARGV) do out[i] = respire_id_sortable(id) end\n"
    padded = await lua(client, body + "return out", *IDS)
    assert padded[3] == "00000000000000000005-00000000000000000010"
    assert padded[-1] == f"{MAX}-{MAX}"
    assert {len(p) for p in padded} == {41}
    assert sorted(padded) == padded  # IDS are listed in stream id order


async def test_unsortable_restores_the_stream_id_of_padded_and_unpadded_text(
    client: RedisClient,
) -> None:
    body = (
        "local out = {}\nfor _, id in ipairs(ARGV) do\n"
        "  out[#out + 1] = respire_id_unsortable(respire_id_sortable(id))\n"
        "  out[#out + 1] = respire_id_unsortable(id)\nend\nreturn out"
    )
    back = await lua(client, body, *IDS)
    assert back == [id for id in IDS for _ in range(2)]
