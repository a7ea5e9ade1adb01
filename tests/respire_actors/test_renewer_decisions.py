"""The lease renewer's pure decisions: its cadence, which leases have expired, when it wakes."""

from __future__ import annotations

import anyio
import pytest

from respire_actors.actors.messages import Delivery
from respire_actors.actors.renewer import (
    MIN_RENEW_INTERVAL,
    expired,
    next_wake,
    pass_interval,
    renew_interval,
    renewal_verdict,
    term,
)
from respire_actors.actors.runtime import Lease
from respire_actors.actors.source import (
    GONE,
    LOST,
    RENEWED,
    UNCONFIRMED,
    renew_item,
)

pytestmark = pytest.mark.anyio  # a CancelScope needs a running event loop


def lease(
    confirmed_at: float,
    *,
    lost: bool = False,
    fields: dict[bytes, bytes] | None = None,
    grouped: bool = False,
    term: float | None = None,
) -> Lease:
    return Lease(
        Delivery("1-1", fields or {}, 3),
        object(),
        anyio.CancelScope(),
        confirmed_at,
        lost,
        grouped=grouped,
        term=term,
    )


def test_the_cadence_is_a_third_of_the_visibility_timeout_with_a_floor() -> None:
    assert renew_interval(120.0) == 40.0
    assert renew_interval(0.3) == pytest.approx(0.1)
    assert renew_interval(0.01) == pytest.approx(0.01 / 3)  # the 10 ms minimum visibility
    assert renew_interval(0.006) == MIN_RENEW_INTERVAL


async def test_a_lease_expires_a_whole_visibility_timeout_after_its_last_confirmation() -> None:
    fresh, due, old, gone = lease(9.5), lease(9.0), lease(1.0), lease(1.0, lost=True)
    assert expired([fresh, due, old, gone], now=10.0, visibility=1.0) == [due, old]
    assert expired([fresh], now=10.49, visibility=1.0) == []


async def test_the_renewer_wakes_early_for_a_lease_about_to_expire() -> None:
    assert next_wake([], now=10.0, visibility=3.0, interval=1.0) == 11.0
    assert next_wake([lease(9.0)], now=10.0, visibility=3.0, interval=1.0) == 11.0
    assert next_wake([lease(7.5)], now=10.0, visibility=3.0, interval=1.0) == 10.5
    assert next_wake([lease(7.5, lost=True)], now=10.0, visibility=3.0, interval=1.0) == 11.0


async def test_a_renewal_item_carries_the_job_group_or_nothing() -> None:
    assert renew_item(lease(0).delivery) == ("1-1", 3, "")
    grouped = lease(0, fields={b"_respire.job.group": b"tenant-7"})
    assert renew_item(grouped.delivery) == ("1-1", 3, "tenant-7")


async def test_a_group_lease_shorter_than_the_visibility_timeout_sets_the_pace() -> None:
    plain, known = lease(0), lease(0, grouped=True, term=0.6)
    unknown = lease(0, grouped=True)
    assert pass_interval([plain], visibility=120.0) == 40.0
    assert pass_interval([plain, known], visibility=120.0) == pytest.approx(0.2)
    # before its first renewal a grouped lease counts as the shortest a group may have
    assert pass_interval([plain, unknown], visibility=120.0) == pytest.approx(0.1 / 3)
    assert pass_interval([lease(0, grouped=True, term=600.0)], visibility=3.0) == 1.0
    assert pass_interval([lease(0, grouped=True, lost=True)], visibility=3.0) == 1.0
    assert term(known, 120.0) == 0.6
    assert term(unknown, 120.0) == 120.0  # expired only by what is known to bound it
    assert term(lease(0, grouped=True, term=600.0), 3.0) == 3.0


async def test_a_group_lease_expires_after_its_own_term() -> None:
    short = lease(9.0, grouped=True, term=0.5)
    assert expired([short, lease(9.0)], now=9.6, visibility=3.0) == [short]
    assert next_wake([short], now=9.1, visibility=3.0, interval=1.0) == 9.5


async def test_a_lease_lost_after_its_handler_returned_is_left_to_the_commit() -> None:
    """A handler returned and its outcome is on its way to the completer (a full mailbox) when
    the renewer finds its entry taken: the job used to be counted twice, as a lost lease and
    then as a stale completion (chaos s3 saw 11 rejections for 6 jobs). The commit reports it."""
    from types import SimpleNamespace

    from respire_actors.actors.runtime import WorkerStatistics, lose_lease

    rt = SimpleNamespace(stats=WorkerStatistics())
    arg = SimpleNamespace(lease_lost=False)
    running, returned = lease(1.0), lease(1.0)
    running.arg = returned.arg = arg
    returned.returned = True
    lose_lease(rt, returned)  # type: ignore[arg-type]
    assert returned.lost and not returned.scope.cancel_called
    assert (rt.stats.leases_lost, arg.lease_lost) == (0, False)
    lose_lease(rt, running)  # type: ignore[arg-type]
    assert running.scope.cancel_called and rt.stats.leases_lost == 1


async def test_a_lease_whose_handler_returned_is_settled_not_lost() -> None:
    """Found by review: a renewal answered 'not pending' because the completer had just
    acknowledged the entry was logged as "lease lost ... cancelling its handler" for jobs that
    ran once and completed; the operator docs tell such warnings to expect duplicates."""
    running, returned, handed = lease(0), lease(0), lease(0)
    returned.returned = True
    handed.handed = True
    for status in (LOST, GONE):
        assert renewal_verdict(running, status) == "lost"
        assert renewal_verdict(returned, status) == "settled"
        assert renewal_verdict(handed, status) == "settled"
    assert renewal_verdict(returned, RENEWED) == "renewed"
    assert renewal_verdict(running, 1500) == "renewed"  # a group lease's term in ms
    assert renewal_verdict(running, UNCONFIRMED) == "unconfirmed"
