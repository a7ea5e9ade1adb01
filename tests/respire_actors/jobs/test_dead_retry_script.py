"""job_dead_retry refuses a dead letter whose job id is not the one the caller read.

admin/queue_admin.py reads each letter's job id first (it names the result record the retry
deletes, KEYS[3]) and then calls job_dead_retry per letter; the script re-checks that the letter
still carries that job id and answers 'changed' otherwise ("ids that are gone ... are skipped").
Without the check a letter replaced in between (the dead stream deleted and refilled, a letter
written with an explicit id) is replayed and the result record of ANOTHER job is deleted.
No test calls the script with a mismatching job id.

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

from typing import Any

import pytest
from jobs_helpers import text

from respire_actors.jobs import JobQueue
from respire_actors.redis.client import RedisClient
from respire_actors.redis.scripts import load

pytestmark = pytest.mark.anyio


async def test_a_letter_of_another_job_is_not_retried(
    client: RedisClient, queue: JobQueue[Any]
) -> None:
    k = queue.keys
    letter = text(
        await client.execute(
            "XADD", k.dead, "*", "_respire.job.id", "job-a", "_respire.job.payload", "pa"
        )
    )
    # the caller believes the letter belongs to job-b, whose result record exists
    await client.execute("HSET", k.result("job-b"), "state", "dead-lettered")
    reply = await load("job_dead_retry")(
        client, (k.dead, k.ready, k.result("job-b")), (letter, "job-b")
    )
    assert text(reply) == "changed"
    assert await client.execute("XLEN", k.dead) == 1  # the letter stays
    assert await client.execute("EXISTS", k.ready) == 0  # nothing replayed
    assert await client.execute("EXISTS", k.result("job-b")) == 1  # job-b's record untouched
