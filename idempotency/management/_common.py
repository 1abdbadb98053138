"""What the package's management commands share: their options and how they are read.

A module of its own, so that no command imports another command's module.
"""

from __future__ import annotations

import re
from argparse import ArgumentParser
from collections.abc import Sized
from datetime import timedelta

from django.core.management.base import CommandError
from django.db import connections

from idempotency.models import PURGEABLE

_AGE = re.compile(r"^\s*(\d+)\s*([dhms])\s*$", re.IGNORECASE)
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def add_dry_run_and_batch_size(
    parser: ArgumentParser, *, dry_run: str, batch: str, setting: str
) -> None:
    """``--dry-run`` (whose help is ``dry_run``) and ``--batch-size N`` (default: ``setting``)."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run)
    parser.add_argument(
        "--batch-size", metavar="N", help=f"{batch} (default: IDEMPOTENCY[{setting!r}])."
    )


def parse_age(value: str) -> timedelta:
    """``7d``, ``12h``, ``30m`` or ``45s`` as a ``timedelta``."""
    match = _AGE.match(value)
    if match is None or int(match.group(1)) == 0:
        raise CommandError(
            f"--older-than should be a positive number with a unit d, h, m or s "
            f"(e.g. 7d, 12h, 30m, 45s), not {value!r}."
        )
    return timedelta(**{_UNITS[match.group(2).lower()]: int(match.group(1))})


def records(count: int) -> str:
    return f"{count:,} record{'' if count == 1 else 's'}"


def positive_int(value: str | int | None, option: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise CommandError(f"{option} should be a positive integer, not {value!r}.")
    return number


def statuses(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    chosen = [part.strip().upper() for value in values for part in value.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(PURGEABLE))
    if unknown:
        raise CommandError(
            f"--status should be one of {', '.join(PURGEABLE)}, not {', '.join(unknown)} "
            "(PROCESSING and NEEDS_REVIEW records are never purged)."
        )
    return chosen


def add_database_argument(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--database",
        metavar="ALIAS",
        help="Only this database (default: every database that holds records: "
        "IDEMPOTENCY['SHARDS'], else the routers' allow_migrate; each tenant schema under "
        "django-tenants).",
    )


def chosen_database(alias: str | None) -> str | None:
    if alias is not None and alias not in connections:
        raise CommandError(
            f"--database should be an alias of DATABASES ({', '.join(connections)}), not {alias!r}."
        )
    return alias


def shards(results: Sized) -> str:
    return f"{len(results)} shard{'' if len(results) == 1 else 's'}"
