"""What the records' database says of its cluster: on the servers the suite runs on, none.

A PostgreSQL primary with a standby is the replica pass's (tests/deployment/test_replica.py),
a Patroni cluster the patroni pass's, a Galera node the galera pass's: each checks what
these functions read there through ``manage.py check --database``.
"""

from __future__ import annotations

import pytest
from django.db import connection

from idempotency.stores import clusters

pytestmark = pytest.mark.django_db


def test_this_database_is_no_galera_node():
    assert clusters.galera("default") is None


def test_a_primary_without_standbys_replicates_to_none():
    found = clusters.replication("default")
    if connection.vendor == "postgresql":
        assert found == clusters.Replication(standbys=0, synchronous=False)
    else:
        assert found is None  # replication is PostgreSQL's question
