"""The pure decision objects, driven directly with an injected clock and random source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisors import Backoff, BackoffTracker, Restart, RestartIntensity, Strategy
from supervisors._policy import restart_range, should_restart


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("restart", "error", "expected"),
    [
        (Restart.PERMANENT, None, True),
        (Restart.PERMANENT, ValueError(), True),
        (Restart.TRANSIENT, None, False),
        (Restart.TRANSIENT, ValueError(), True),
        (Restart.TEMPORARY, None, False),
        (Restart.TEMPORARY, ValueError(), False),
    ],
)
def test_should_restart_follows_the_restart_type(
    restart: Restart, error: Exception | None, expected: bool
) -> None:
    assert should_restart(restart, error) is expected


@pytest.mark.parametrize(
    ("strategy", "index", "expected"),
    [
        (Strategy.ONE_FOR_ONE, 1, [1]),
        (Strategy.ONE_FOR_ALL, 1, [0, 1, 2, 3]),
        (Strategy.REST_FOR_ONE, 1, [1, 2, 3]),
        (Strategy.REST_FOR_ONE, 3, [3]),
        (Strategy.REST_FOR_ONE, 0, [0, 1, 2, 3]),
    ],
)
def test_restart_range_per_strategy(strategy: Strategy, index: int, expected: list[int]) -> None:
    assert list(restart_range(strategy, index, 4)) == expected


def test_restart_range_rejects_out_of_range_index() -> None:
    with pytest.raises(IndexError):
        restart_range(Strategy.ONE_FOR_ONE, 4, 4)


def test_intensity_allows_max_restarts_within_period_then_refuses() -> None:
    clock = Clock()
    intensity = RestartIntensity(2, 10.0, clock=clock)
    assert intensity.record() is True
    clock.now = 1.0
    assert intensity.record() is True
    clock.now = 2.0
    assert intensity.record() is False
    assert intensity.restarts_in_period == 3


def test_intensity_window_slides() -> None:
    clock = Clock()
    intensity = RestartIntensity(1, 10.0, clock=clock)
    assert intensity.record() is True
    clock.now = 9.999
    assert intensity.restarts_in_period == 1
    clock.now = 10.0  # the first restart is exactly one period old: no longer counted
    assert intensity.restarts_in_period == 0
    assert intensity.record() is True
    clock.now = 15.0
    assert intensity.record() is False


def test_intensity_zero_refuses_the_first_restart() -> None:
    assert RestartIntensity(0, 1.0, clock=Clock()).record() is False


def test_intensity_memory_is_bounded() -> None:
    intensity = RestartIntensity(3, 1e9, clock=Clock())
    for _ in range(1000):
        intensity.record()
    assert intensity.restarts_in_period == 4


@given(
    max_restarts=st.integers(min_value=0, max_value=5),
    period=st.floats(min_value=0.5, max_value=20),
    gaps=st.lists(st.floats(min_value=0, max_value=10), max_size=40),
)
def test_intensity_matches_a_brute_force_count(
    max_restarts: int, period: float, gaps: list[float]
) -> None:
    clock = Clock()
    intensity = RestartIntensity(max_restarts, period, clock=clock)
    history: list[float] = []
    for gap in gaps:
        clock.now += gap
        history.append(clock.now)
        in_window = [t for t in history if clock.now - t < period]
        assert intensity.record() is (len(in_window) <= max_restarts)


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    backoff = Backoff(initial=0.1, factor=2, maximum=1.0, jitter=0)
    delays = [backoff.delay(n, random=lambda: 0.5) for n in range(6)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_backoff_never_overflows() -> None:
    backoff = Backoff(initial=0.1, factor=10, maximum=3.0)
    assert backoff.base_delay(100_000) == 3.0


def test_backoff_zero_initial_means_no_delay() -> None:
    backoff = Backoff(initial=0, maximum=0, jitter=1)
    assert [backoff.delay(n, random=lambda: 0.99) for n in range(5)] == [0.0] * 5


def test_backoff_jitter_bounds_use_the_random_source() -> None:
    backoff = Backoff(initial=1.0, factor=2, maximum=10.0, jitter=0.25)
    assert backoff.delay(1, random=lambda: 0.0) == pytest.approx(1.5)
    assert backoff.delay(1, random=lambda: 0.5) == pytest.approx(2.0)
    assert backoff.delay(1, random=lambda: 1.0) == pytest.approx(2.5)
    # Near the cap, jitter can only shorten the delay.
    assert backoff.delay(10, random=lambda: 1.0) == 10.0
    assert backoff.delay(10, random=lambda: 0.0) == pytest.approx(7.5)


@given(
    initial=st.floats(min_value=0.001, max_value=1),
    factor=st.floats(min_value=1, max_value=5),
    cap=st.floats(min_value=1, max_value=100),
    jitter=st.floats(min_value=0, max_value=1),
    attempt=st.integers(min_value=0, max_value=10_000),
    sample=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_delay_stays_within_jitter_band_and_cap(
    initial: float, factor: float, cap: float, jitter: float, attempt: int, sample: float
) -> None:
    backoff = Backoff(initial=initial, factor=factor, maximum=cap, jitter=jitter)
    base = backoff.base_delay(attempt)
    delay = backoff.delay(attempt, random=lambda: sample)
    assert 0 <= delay <= cap
    assert base * (1 - jitter) - 1e-9 <= delay <= base * (1 + jitter) + 1e-9


def test_tracker_counts_consecutive_restarts() -> None:
    clock = Clock()
    tracker = BackoffTracker(
        Backoff(initial=1, factor=3, maximum=100, jitter=0, reset_after=10), clock=clock
    )
    delays = []
    for _ in range(3):
        tracker.started()
        clock.now += 1  # short runs: not healthy
        delays.append(tracker.next_delay())
    assert delays == [1, 3, 9]
    assert tracker.attempt == 3


def test_tracker_resets_after_a_healthy_run() -> None:
    clock = Clock()
    tracker = BackoffTracker(
        Backoff(initial=1, factor=3, maximum=100, jitter=0, reset_after=10), clock=clock
    )
    tracker.started()
    assert tracker.next_delay() == 1
    tracker.started()
    assert tracker.next_delay() == 3
    tracker.started()
    clock.now += 9.5
    assert tracker.next_delay() == 9  # 9.5 s is not healthy yet
    tracker.started()
    clock.now += 10
    assert tracker.next_delay() == 1  # a healthy run: back to the initial delay


def test_tracker_does_not_reset_on_start_failures() -> None:
    clock = Clock()
    tracker = BackoffTracker(
        Backoff(initial=1, factor=2, maximum=100, jitter=0, reset_after=1), clock=clock
    )
    tracker.started()
    clock.now += 100
    assert tracker.next_delay() == 1
    clock.now += 100  # failed during start: never reported ready, however long it took
    assert tracker.next_delay() == 2


def test_tracker_jitter_comes_from_the_injected_random() -> None:
    samples = iter([0.0, 1.0])
    tracker = BackoffTracker(
        Backoff(initial=1, factor=1, maximum=2, jitter=0.5),
        clock=Clock(),
        random=lambda: next(samples),
    )
    assert tracker.next_delay() == pytest.approx(0.5)
    assert tracker.next_delay() == pytest.approx(1.5)
