"""Signals for metrics and logs. Each is sent with ``sender=IdempotencyRecord``.

Keys are passed for logs and traces; never use them as metric labels.
"""

from django.dispatch import Signal

# record, operation, reclaimed: bool
record_claimed = Signal()
# record, operation
response_replayed = Signal()
# operation, retry_after
key_in_use = Signal()
# record, operation
key_reused = Signal()
# record, operation, status
record_completed = Signal()
# record, operation, outcome (one of "succeeded", "released", "needs_review", "unknown")
record_recovered = Signal()
# count, dry_run
records_purged = Signal()
