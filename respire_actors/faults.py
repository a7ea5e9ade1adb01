"""Fault-injection points, for the chaos suite only (``python -m respire_actors chaos``).

The runtime calls :func:`point` at the few places where a crash is most interesting: the
completer right before it sends a batch of outcomes (the handler returned, nothing committed)
and right after the completion script's reply arrived (committed on the server, the worker has
not seen it yet), the promoter right after a pass moved due scheduled jobs, and the reliable
queue right before and after its ack script. When nothing is armed, which is always the case
outside the chaos suite, :func:`point` is one global load and a comparison (see
``benchmarks/bench_faults.py``); nothing reads the environment on import.

The chaos worker process arms points at start-up from ``RESPIRE_FAULT_POINT``
(:func:`arm_from_environment`), and its payload-driven handler may arm one just before it
returns. A spec is ``NAME:ACTION[:HIT]``, several separated by commas:

* ``kill``: SIGKILL this process (a crash: nothing after it runs, no reply is handled);
* ``stop``: SIGSTOP this process (a pause: it continues when sent SIGCONT);
* ``raise``: raise :class:`FaultInjected` (an in-process failure at that point);

``HIT`` (default 1) fires on that call of the point, counted from arming; a point fires once,
then disarms itself. Never arm points in production: a killed or stopped worker is exactly
what the point is for.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

ENVIRONMENT_VARIABLE = "RESPIRE_FAULT_POINT"

POINTS = frozenset(
    {
        "completer.before-commit",  # a batch of outcomes is about to be sent
        "completer.after-commit",  # its script ran and replied; the reply is not yet handled
        "promoter.after-promote",  # due scheduled jobs were moved to the ready stream
        "reliable.before-ack",  # a reliable-queue ack is about to be sent
        "reliable.after-ack",  # the ack ran; its reply is not yet handled
    }
)
ACTIONS = frozenset({"kill", "stop", "raise"})


class FaultInjected(RuntimeError):
    """Raised by a point armed with the ``raise`` action."""


@dataclass
class _Fault:
    action: str
    hit: int
    when: Callable[[object], bool] | None = None
    calls: int = 0


_armed: dict[str, _Fault] | None = None


def point(name: str, subject: object = None) -> None:
    """A fault-injection point: returns at once unless a fault is armed for ``name``.
    ``subject`` is what the point is about (the completer passes its batch), for a fault armed
    with a ``when`` predicate."""
    if _armed is None:
        return
    _fire(name, subject)


def _fire(name: str, subject: object) -> None:
    global _armed
    if _armed is None or (fault := _armed.get(name)) is None:
        return
    if fault.when is not None and not fault.when(subject):
        return  # not about the subject this fault waits for: not counted
    fault.calls += 1
    if fault.calls < fault.hit:
        return
    del _armed[name]
    if not _armed:
        _armed = None
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        raise FaultInjected(f"fault injected at {name}")


def parse(spec: str) -> dict[str, _Fault]:
    """``"completer.after-commit:kill,reliable.before-ack:raise:2"`` -> armed faults; raises
    ValueError for an unknown point or action or a bad hit count."""
    faults: dict[str, _Fault] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rest = item.partition(":")
        action, _, hit = rest.partition(":")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r}; known: {', '.join(sorted(POINTS))}")
        if action not in ACTIONS:
            raise ValueError(
                f"unknown fault action {action!r}; known: {', '.join(sorted(ACTIONS))}"
            )
        if hit and (not hit.isdigit() or int(hit) < 1):
            raise ValueError(f"bad hit count {hit!r} in {item!r}: a positive integer")
        faults[name] = _Fault(action, int(hit or 1))
    return faults


def arm(spec: str, when: Callable[[object], bool] | None = None) -> None:
    """Arm the faults of ``spec`` (added to those armed; the same point is re-armed). With
    ``when``, a call of the point counts only if ``when(subject)`` is true (e.g. the batch
    holds a given job's outcome)."""
    global _armed
    faults = parse(spec)
    for fault in faults.values():
        fault.when = when
    if faults:
        _armed = {**(_armed or {}), **faults}


def arm_from_environment() -> None:
    """Arm ``$RESPIRE_FAULT_POINT`` if set (the chaos worker calls this at start-up)."""
    spec = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if spec:
        arm(spec)


def disarm() -> None:
    """Disarm every point."""
    global _armed
    _armed = None
