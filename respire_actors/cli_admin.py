"""The operator commands of ``python -m respire_actors``: tables a person can scan (rich),
``--json`` for scripts. Every read and change goes through :mod:`respire_actors.admin`.

``cli.main`` parses the command line, connects and maps failures to exit codes; this module
adds the subcommands (:func:`add_admin_commands`) and runs one (:func:`run_admin_command`).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .actors.messages import DeadLetterReason
from .admin import QueueAdmin, QueueSummary, TrimPlan, list_queues
from .codecs import BytesCodec
from .errors import PermissionDenied, ValidationError
from .jobs.options import RateLimit
from .jobs.partitioned import PartitionedJobQueue
from .keys import partitions_key
from .redis.client import RedisClient
from .retention import TRIM_STREAMS, entry_id_key

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

ADMIN_COMMANDS = (
    "queues",
    "queue",
    "dead-letters",
    "retry",
    "pause",
    "resume",
    "rate",
    "events",
    "logs",
    "pending",
    "trim",
)


REASONS = tuple(r.value for r in DeadLetterReason)
"""The dead-letter reasons --reason accepts."""


class CommandFailed(Exception):
    """A command could not do what was asked; its message says what to do (exit code 1)."""


# ------------------------------------------------------------------------------------------
# output


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, width=None if probe.is_terminal else 200, highlight=False)


def to_jsonable(value: Any) -> Any:
    """Dataclasses, datetimes, timedeltas and bytes as JSON values (bytes as UTF-8 text when
    they decode, else ``{"base64": ...}``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, TrimPlan):
            out["safe"] = value.safe
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, sort_keys=False) + "\n")


def _ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _rate(policy: RateLimit | None) -> str:
    if policy is None:
        return "-"
    return f"{policy.permit_limit}/{policy.window_ms / 1000:g}s"


def _time(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _text(value: bytes, width: int = 60) -> str:
    text = value.decode("utf-8", "replace")
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    console: Console | None = None,
) -> None:
    """Print a table whose cells are never folded: an entry id or count split over two lines
    could not be copied back into a command. A table wider than the terminal is printed at
    its own width (the terminal wraps whole lines instead)."""
    # cells and title are text, never Rich markup: queue names, job ids and dead-letter
    # details come from the queue's data ("[/api]" in an exception text is no closing tag)
    table = Table(title=Text(title), title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(Text("-" if c is None else str(c)) for c in row))
    console = console or _console()
    needed = console.measure(table, options=console.options.update_width(10_000)).maximum
    if needed > console.width:
        console = Console(
            file=console.file, width=needed, highlight=False, force_terminal=console.is_terminal
        )
    console.print(table)


def _summary_row(s: QueueSummary) -> list[object]:
    return [
        s.name,
        s.ready,
        s.pending,
        _ms(s.oldest_pending_age_ms),
        "?" if s.lag is None else s.lag,
        s.scheduled,
        s.dead_letters,
        "yes" if s.paused else "no",
        _rate(s.rate_limit),
        s.consumers,
    ]


SUMMARY_COLUMNS = (
    "queue", "ready", "pending", "oldest pending", "lag", "scheduled", "dead", "paused",
    "rate limit", "consumers",
)  # fmt: skip


# ------------------------------------------------------------------------------------------
# commands


async def _queues(client: RedisClient, args: argparse.Namespace) -> int:
    names = await list_queues(client)
    summaries = []
    for name in names:
        try:
            summaries.append(await QueueAdmin(client, name).summary())
        except PermissionDenied as exc:
            # a user scoped to some queues: the registry still lists every queue
            _console(stderr=True).print(
                f"queue {name!r} is not readable by this Redis user, skipped ({exc}); "
                "grant its key pattern to list it",
                markup=False,
            )
    if args.json:
        _print_json(summaries)
    elif not summaries:
        print("no job queues are registered yet (a worker registers its queues when it starts)")
    else:
        _table("job queues", SUMMARY_COLUMNS, [_summary_row(s) for s in summaries])
    return EXIT_OK


async def _partitions(client: RedisClient, name: str) -> int | None:
    """The partition count recorded for ``name`` (a partitioned queue), or None."""
    raw = await client.execute("GET", partitions_key(name, client.settings.key_prefix))
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _whole_partitioned(name: str, count: int) -> CommandFailed:
    return CommandFailed(
        f"{name!r} is a partitioned queue of {count} partitions, {name}:p0 .. "
        f"{name}:p{count - 1}: 'pause' and 'resume' take it whole; the other commands take "
        f"one partition (e.g. '{name}:p0')"
    )


async def _one_queue(client: RedisClient, admin: QueueAdmin) -> None:
    """For the reading commands: refuse a partitioned queue's own name (its keys hold nothing:
    an empty answer would say there is nothing where the partitions hold it)."""
    count = await _partitions(client, admin.name)
    if count is not None:
        raise _whole_partitioned(admin.name, count)


async def _known(client: RedisClient, admin: QueueAdmin) -> QueueSummary:
    summary = await admin.summary()
    empty = not (summary.ready or summary.dead_letters or summary.scheduled or summary.paused)
    if empty and admin.name not in await list_queues(client):
        count = await _partitions(client, admin.name)
        if count is not None:
            raise _whole_partitioned(admin.name, count)
        raise CommandFailed(
            f"no job queue named {admin.name!r}: it is not registered and holds nothing "
            "(list the queues with 'python -m respire_actors queues')"
        )
    return summary


async def _queue(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    summary = await _known(client, admin)
    reasons = await admin.dead_letter_reasons(1000)
    metrics = await admin.queue.read_metrics(5) if summary.metrics_enabled else []
    if args.json:
        _print_json(
            {"summary": summary, "dead_letter_reasons": reasons, "metrics_last_5_minutes": metrics}
        )
        return EXIT_OK
    fields = dict(zip(SUMMARY_COLUMNS, _summary_row(summary), strict=True))
    fields["rate-limit denials"] = summary.rate_limit_hits
    fields["application groups"] = "in use" if summary.groups_in_use else "none"
    if reasons:
        counted = sum(reasons.values())
        label = "dead letters by reason"
        if counted < summary.dead_letters:
            label += f" (newest {counted:,} of {summary.dead_letters:,})"
        fields[label] = ", ".join(f"{r} {n}" for r, n in reasons.items())
    if metrics:
        fields["completed / failed (5 min)"] = (
            f"{sum(m.completed for m in metrics)} / {sum(m.failed for m in metrics)}"
        )
    _table(f"queue {admin.name}", ("", "value"), list(fields.items()))
    return EXIT_OK


async def _dead_letters(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    await _one_queue(client, admin)
    page = await admin.dead_letters(args.before, args.count, reason=args.reason)
    if args.json:
        _print_json(page)
        return EXIT_OK
    _table(
        f"dead letters of {admin.name}" + (f" ({args.reason})" if args.reason else ""),
        ("dead id", "job id", "reason", "attempt", "at", "detail", "payload"),
        [
            (r.dead_id, r.job_id, r.reason, r.attempt, _time(r.at), r.detail, _text(r.payload))
            for r in page.rows
        ],
    )
    if page.next_before:
        print(f"more: --before '{page.next_before}'")
    return EXIT_OK


async def _retry(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    if bool(args.entries) == bool(args.all):
        raise ValidationError("give dead-letter ids or --all (not both)")
    if args.reason and not args.all:
        raise ValidationError("--reason goes with --all")
    if args.entries:
        QueueAdmin._dead_ids(args.entries)  # every id checked before any is retried
    summary = await _known(client, admin)  # a mistyped name is refused, not "0 of 0"
    total = len(args.entries) if args.entries else summary.dead_letters
    retried = scanned = 0
    progress = Progress(
        TextColumn("retrying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=_console(stderr=True), disable=args.json, transient=False,
    )  # fmt: skip
    with progress:
        task = progress.add_task("retry", total=total)
        if args.entries:
            for i in range(0, len(args.entries), 500):
                chunk = args.entries[i : i + 500]
                retried += await admin.retry_dead_letters(chunk)
                scanned += len(chunk)
                progress.update(task, completed=scanned)
        else:
            async for step in admin.retry_all(reason=args.reason, batch=500):
                retried, scanned = step.retried, step.scanned
                progress.update(task, completed=min(scanned, total))
    if args.json:
        _print_json({"queue": admin.name, "scanned": scanned, "retried": retried})
    else:
        print(f"retried {retried} of {scanned} dead letters of {admin.name}")
    if args.entries and retried < len(args.entries):
        raise CommandFailed(
            f"{len(args.entries) - retried} of the {len(args.entries)} ids given are not dead "
            f"letters of {admin.name} (retried or removed already, or mistyped); list them "
            f"with 'python -m respire_actors dead-letters {admin.name}'"
        )
    return EXIT_OK


async def _pause(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    count = await _partitions(client, admin.name)
    if count is not None:  # a partitioned queue: every partition, each with its own event
        queue = PartitionedJobQueue(client, admin.name, BytesCodec(), partitions=count)
        changed_count = await (queue.pause() if args.command == "pause" else queue.resume())
        state = "paused" if args.command == "pause" else "resumed"
        print(f"{admin.name} {state}: {changed_count} of its {count} partitions changed")
        return EXIT_OK
    await _known(client, admin)
    changed = await (admin.pause() if args.command == "pause" else admin.resume())
    state = "paused" if args.command == "pause" else "resumed"
    print(f"{admin.name} {state}" + ("" if changed else " (it already was)"))
    return EXIT_OK


async def _rate_command(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    if args.clear and args.limit is not None:
        raise ValidationError("give --limit and --window, or --clear (not both)")
    if (args.limit is None) != (args.window is None):
        raise ValidationError("--limit and --window go together")
    if args.window is not None and not (math.isfinite(args.window) and args.window <= 2**31):
        raise ValidationError(f"--window must be a finite number of seconds, got {args.window}")
    if args.clear or args.limit is not None:
        await _known(client, admin)
        policy = None if args.clear else RateLimit(args.limit, timedelta(seconds=args.window))
        await admin.set_rate_limit(policy)
    else:
        await _one_queue(client, admin)
    state = await admin.queue.get_state()
    if args.json:
        _print_json({"queue": admin.name, **to_jsonable(state)})
    else:
        _table(
            f"rate limit of {admin.name}",
            ("", "value"),
            [("limit", _rate(state.rate_limit)), ("denied admissions", state.rate_limit_hits)],
        )
    return EXIT_OK


def _event_row(e: Any) -> tuple[object, ...]:
    extra = " ".join(f"{k}={v}" for k, v in e.extra.items())
    return (e.id, e.kind, e.job_id, e.attempt, e.percent, e.reason, extra)


EVENT_COLUMNS = ("event id", "kind", "job id", "attempt", "percent", "reason", "other")


async def _events(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    await _one_queue(client, admin)
    if not args.follow:
        page = await admin.events(args.before, args.count)
        rows = list(reversed(page.rows))  # oldest first, like a log
        if args.json:
            _print_json({"rows": rows, "next_before": page.next_before})
        else:
            _table(f"events of {admin.name}", EVENT_COLUMNS, [_event_row(e) for e in rows])
        return EXIT_OK
    async with admin.queue.read_events(args.cursor) as reader:
        async for event in reader:
            if args.json:
                sys.stdout.write(json.dumps(to_jsonable(event)) + "\n")
            else:
                sys.stdout.write("  ".join("-" if c is None else str(c) for c in _event_row(event)))
                sys.stdout.write("\n")
            sys.stdout.flush()
    return EXIT_OK


async def _logs(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    await _one_queue(client, admin)
    lines = await admin.queue.get_logs(args.job_id, args.count)
    if args.json:
        _print_json({"queue": admin.name, "job_id": args.job_id, "lines": lines})
    elif not lines:
        print(f"no log lines are retained for job {args.job_id!r} of {admin.name}")
    else:
        for line in lines:
            print(line)
    return EXIT_OK


async def _pending(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    await _one_queue(client, admin)
    page = await admin.pending(args.start, args.count, consumer=args.consumer)
    if args.json:
        _print_json(page)
        return EXIT_OK
    _table(
        f"pending deliveries of {admin.name}",
        ("entry id", "job id", "consumer", "idle", "deliveries"),
        [(r.entry_id, r.job_id, r.consumer, _ms(r.idle_ms), r.deliveries) for r in page.rows],
    )
    if page.next_start:
        print(f"more: --start '{page.next_start}'")
    return EXIT_OK


def _plan_rows(plan: TrimPlan) -> list[tuple[object, ...]]:
    return [(plan.stream, plan.length, plan.count, plan.cutoff, _stop_reason(plan))]


def _stop_reason(plan: TrimPlan) -> str:
    """Why the plan stops where it does: the per-call limit, a group boundary (the boundary
    entry is itself out of policy, so the policy alone would have gone further), or the policy."""
    if plan.limited:
        return "--limit"
    if plan.boundary and (plan.cutoff is None or plan.cutoff == plan.boundary):
        boundary = entry_id_key(plan.boundary)
        by_age = plan.age_cutoff is not None and boundary < entry_id_key(plan.age_cutoff)
        by_length = plan.max_length is not None and plan.length - plan.count > plan.max_length
        if by_age or by_length:
            return "group boundary"
    return "policy"


async def _trim(client: RedisClient, args: argparse.Namespace) -> int:
    admin = _admin(client, args)
    if args.max_age is None and args.max_length is None:
        raise ValidationError("give --max-age SECONDS and/or --max-length N")
    await _known(client, admin)
    streams = TRIM_STREAMS if args.stream == "all" else (args.stream,)
    plans = [
        await admin.trim_plan(s, max_age=args.max_age, max_length=args.max_length, limit=args.limit)
        for s in streams
    ]
    results = []
    if not args.dry_run:
        results = [await admin.trim(p) for p in plans]
    if args.json:
        _print_json({"queue": admin.name, "dry_run": args.dry_run, "plans": plans,
                     "results": results})  # fmt: skip
    else:
        rows = [row for p in plans for row in _plan_rows(p)]
        title = f"trim of {admin.name}" + (" (dry run: nothing removed)" if args.dry_run else "")
        columns = ["stream", "length", "would go" if args.dry_run else "planned", "cutoff",
                   "stopped by"]  # fmt: skip
        if results:
            columns.append("removed")
            rows = [(*r, res.aborted or res.removed) for r, res in zip(rows, results, strict=True)]
        _table(title, columns, rows)
        for plan in plans:
            for g in plan.groups:
                print(
                    f"  {plan.stream}: group {g.name}: {g.pending} pending, lowest "
                    f"{g.lowest_pending or '-'}, first undelivered {g.first_undelivered or '-'}"
                )
    aborted = [r for r in results if r.aborted]
    if aborted:
        raise CommandFailed(
            f"{len(aborted)} trim(s) aborted ({aborted[0].aborted}); nothing was removed "
            "there: run the command again"
        )
    return EXIT_OK


def _admin(client: RedisClient, args: argparse.Namespace) -> QueueAdmin:
    return QueueAdmin(client, args.name, dead_stream=getattr(args, "dead_stream", None))


_RUNNERS: dict[str, Callable[[RedisClient, argparse.Namespace], Any]] = {
    "queues": _queues,
    "queue": _queue,
    "dead-letters": _dead_letters,
    "retry": _retry,
    "pause": _pause,
    "resume": _pause,
    "rate": _rate_command,
    "events": _events,
    "logs": _logs,
    "pending": _pending,
    "trim": _trim,
}


async def run_admin_command(client: RedisClient, args: argparse.Namespace) -> int:
    """Run one operator command on a connected client; returns the exit code. Bad arguments
    (:class:`ValidationError`) print one ``error:`` line and return 2; a command that could not
    do what was asked returns 1 the same way. Other errors propagate to ``cli.main``."""
    try:
        return int(await _RUNNERS[args.command](client, args))
    except ValidationError as exc:
        print(f"error: {exc} (see 'python -m respire_actors {args.command} --help')",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    except CommandFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


# ------------------------------------------------------------------------------------------
# the parsers


def add_admin_commands(sub: Any, parents: Sequence[argparse.ArgumentParser], epilog: str) -> None:
    """Add the operator subcommands to ``sub`` (an argparse subparsers object); ``parents``
    carry the options every command shares (log level, server, backend)."""
    fmt = argparse.RawDescriptionHelpFormatter

    def command(name: str, help_text: str, *, json_output: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".",
            epilog=epilog, formatter_class=fmt, parents=list(parents),
        )  # fmt: skip
        if json_output:
            p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        return p

    def named(p: argparse.ArgumentParser, dead: bool = False) -> None:
        p.add_argument("name", metavar="NAME", help="the job queue")
        if dead:
            p.add_argument(
                "--dead-stream", default=None, metavar="SUFFIX",
                help="dead-letter stream suffix, if the workers set WorkerOptions("
                "dead_letter_stream=...)",
            )  # fmt: skip

    def count(p: argparse.ArgumentParser, default: int, high: int = 1000) -> None:
        p.add_argument("--count", type=int, default=default, metavar="N",
                       help=f"rows per page, 1-{high} (default {default})")  # fmt: skip

    command("queues", "show every registered job queue as a status table")
    named(p := command("queue", "show one job queue in detail"), dead=True)
    named(p := command("dead-letters", "list a queue's dead letters, newest first"), dead=True)
    count(p, 50)
    p.add_argument("--reason", default=None, choices=REASONS, help="only this dead-letter reason")
    p.add_argument("--before", default=None, metavar="ID", help="page: older than this id")
    p = command("retry", "re-enqueue dead letters with their original job id and payload")
    named(p, dead=True)
    p.add_argument("entries", nargs="*", metavar="ENTRY", help="dead-letter ids to retry")
    p.add_argument("--all", action="store_true", help="retry every dead letter (paged)")
    p.add_argument("--reason", default=None, choices=REASONS, help="with --all: only this reason")
    for name, text in (("pause", "pause"), ("resume", "resume")):
        named(command(name, f"{text} a job queue for every worker", json_output=False))
    named(p := command("rate", "show, set or clear a queue's rate limit"))
    p.add_argument("--limit", type=int, default=None, metavar="N", help="admissions per window")
    p.add_argument("--window", type=float, default=None, metavar="SECONDS", help="window length")
    p.add_argument("--clear", action="store_true", help="remove the rate limit")
    named(p := command("events", "show a queue's newest events, or follow them"))
    count(p, 50)
    p.add_argument("--before", default=None, metavar="ID", help="page: older than this id")
    p.add_argument("--follow", action="store_true",
                   help="keep printing new events until interrupted (one line or JSON object "
                   "each)")  # fmt: skip
    p.add_argument("--cursor", default="$", metavar="ID",
                   help="with --follow: start after this event id ('0-0': everything "
                   "retained; default '$': only new events)")  # fmt: skip
    named(p := command("logs", "show a job's retained log lines"))
    p.add_argument("job_id", metavar="JOB_ID", help="the job id")
    count(p, 100)
    named(p := command("pending", "list deliveries not yet acknowledged (XPENDING)"))
    count(p, 50)
    p.add_argument("--start", default="-", metavar="ID", help="page: from this id")
    p.add_argument("--consumer", default=None, help="only this consumer's deliveries")
    p = command("trim", "safely trim a queue's streams (see docs/retention.md)")
    named(p, dead=True)
    p.add_argument("--stream", choices=(*TRIM_STREAMS, "all"), default="all",
                   help="which stream (default: all three)")  # fmt: skip
    p.add_argument("--max-age", type=float, default=None, metavar="SECONDS",
                   help="remove entries older than this")  # fmt: skip
    p.add_argument("--max-length", type=int, default=None, metavar="N",
                   help="keep at most the newest N entries")  # fmt: skip
    p.add_argument("--limit", type=int, default=10_000, metavar="N",
                   help="most entries removed per stream (default 10000)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print what would go; remove nothing")


__all__ = ["ADMIN_COMMANDS", "add_admin_commands", "run_admin_command", "to_jsonable"]
