"""The supervisor of one consumer: the same actors for job queues and stream workers."""

from __future__ import annotations

from collections.abc import Sequence

from supervisors import Backoff, ChildSpec, Supervisor

from ..jobs.options import duration_ms
from ..jobs.runtime import QueueRuntime
from .completer import run_completer
from .reader import run_reader
from .runner import run_runner_pool
from .sweeper import run_sweeper


def consumer_supervisor(
    name: str,
    rt: QueueRuntime,
    *,
    recovery: bool = True,
    before_reader: Sequence[ChildSpec] = (),
) -> Supervisor:
    """``completer, runners, [sweeper], *before_reader, reader`` under one_for_one.

    Started in that order and stopped in reverse: intake stops first, runners get the shutdown
    grace, the completer drains last. Without ``recovery`` no sweeper runs (no startup replay,
    no visibility recovery), and the reader does not wait for a replay.
    """
    grace = duration_ms(rt.options.shutdown_grace, what="shutdown_grace", allow_zero=True) / 1000
    io = rt.client.settings.command_timeout + 1
    children = [
        ChildSpec("completer", run_completer, rt, shutdown=grace + 2 * io),
        ChildSpec("runners", run_runner_pool, rt, shutdown=grace),
    ]
    if recovery:
        children.append(ChildSpec("sweeper", run_sweeper, rt, shutdown=io))
    else:
        rt.replay_done.set()
    children += list(before_reader)
    children.append(ChildSpec("reader", run_reader, rt, shutdown=io))
    return Supervisor(
        name, children, max_restarts=10, period=30.0, backoff=Backoff(initial=0.1, maximum=5.0)
    )
