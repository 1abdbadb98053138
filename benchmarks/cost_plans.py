"""The plans of the claim, the replay read, recovery and purge on a table of many records.

``EXPLAIN (ANALYZE, BUFFERS)`` of the statements this app sends, each in a
transaction rolled back, on ``rows`` records in known shapes (filled with
``generate_series``, one creation time and lease end each): 1% expired, 1%
created 30 days ago, 0.5% ``PROCESSING`` in lease mode of which a fifth lost
their lease, none ``NEEDS_REVIEW``; the rest finished and live.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from benchmarks import bulk

FILL = f"""
INSERT INTO {bulk.TABLE} (
    scope, idem_key, operation, request_hash, request_method, request_path, status,
    owner_token, lease_until, response_status, response_headers, resource_id, attempts,
    recovery_attempts, version, created_at, updated_at, completed_at, expires_at
)
SELECT
    'user:' || (i %% 1000) || ':bench.plans', 'key-' || i, 'bench.plans',
    decode(md5(i::text), 'hex'), 'POST', '/orders/',
    CASE WHEN i %% 200 = 7 THEN 'PROCESSING' ELSE 'SUCCEEDED' END,
    decode(md5('owner' || i), 'hex'),
    CASE
        WHEN i %% 1000 = 7 THEN now() - interval '1 minute' - i * interval '1 microsecond'
        WHEN i %% 200 = 7 THEN now() + interval '1 minute' + i * interval '1 microsecond'
    END,
    201, '[]'::jsonb, i::text, 1, 0, 1,
    -- The first thousand were made 30 days ago: ids grow with created_at, as they do.
    CASE WHEN i <= 1000 THEN now() - interval '30 days' ELSE now() - interval '2 hours' END
        + i * interval '0.5 millisecond',
    now(), now(),
    CASE
        WHEN i %% 200 = 7 THEN NULL
        WHEN i %% 100 = 1 THEN now() - interval '1 hour'
        ELSE now() + interval '1 day'
    END
FROM generate_series(1, %s) AS i
"""


def plans(rows: int) -> str:
    """Needs Django set up (``bulk.setup_django``) on a migrated database."""
    started_filling = _fill(rows)
    parts = [f"## Plans on {rows:,} records (filled in {started_filling:.0f} s)", ""]
    for title, plan in _plans().items():
        parts += [f"### {title}", "", "```", plan, "```", ""]
    return "\n".join(parts)


def _fill(rows: int) -> float:
    seconds, _ = bulk.timed(lambda: bulk.execute(FILL, [rows]))
    bulk.execute(f"VACUUM (ANALYZE) {bulk.TABLE}")
    return seconds


def _plans() -> dict[str, str]:

    from idempotency.retention import batch, purgeable
    from idempotency.stores import store_for

    store: Any = store_for("default")
    taken = ("user:7:bench.plans", "key-7007")
    claim = store.sql.claim(False, True, "2000ms")
    candidate = ("user:1:bench.plans", "new-key", "bench.plans", "0" * 64, "POST", "/", "t" * 32)
    recovery = (
        _records()
        .expired_leases()
        .select_for_update(skip_locked=True)
        .order_by("lease_until", "pk")[:100]
    )
    return {
        "The claim of a new key (the INSERT)": bulk.explain(claim, [*candidate, timedelta(days=1)]),
        "The read of a taken key, after the INSERT met it": bulk.explain(store.sql.conflict, taken),
        "The replay read (READ_FIRST)": bulk.explain(store.sql.read_final, taken),
        "Recovery's batch (expired leases, oldest first)": _explain(recovery),
        "Purge's batch (expired records, oldest first)": _explain(
            batch(purgeable(), 1000).values_list("pk", flat=True)
        ),
        "Purge --older-than 7 days": _explain(
            batch(purgeable(older_than=timedelta(days=7)), 1000).values_list("pk", flat=True)
        ),
        # The admin's first page (newest first): no index reads status any more.
        "The admin's list, filtered by a common status": _explain(_page(status="SUCCEEDED")),
        "The admin's list, filtered by a rare status": _explain(_page(status="PROCESSING")),
        "The admin's list, filtered by a status no record has": _explain(
            _page(status="NEEDS_REVIEW")
        ),
        "The admin's stuck filter": _explain(_records().stuck().order_by("-created_at")[:50]),
    }


def _page(**filters: Any) -> Any:
    return _records().filter(**filters).order_by("-created_at")[:50]


def _records() -> Any:
    from idempotency.models import IdempotencyRecord

    return IdempotencyRecord.objects.all()


def _explain(queryset: Any) -> str:
    from django.db import transaction

    with transaction.atomic():  # the locking batches compile only inside one
        sql, params = queryset.query.sql_with_params()
        return bulk.explain(sql, params)
