"""What the records' database says of the cluster around it, for the system checks.

A guarantee of the app is a guarantee of the database under it: a PostgreSQL
primary that acknowledges a commit before a standby has it can lose it in a
failover, and a Galera node holds its row locks (and the MySQL store's
``GET_LOCK`` turn) for itself only. The checks (``idempotency.checks``, ids
``W011`` and ``W012``) ask the database what it is; docs/high-availability.md
says what each answer means.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections


@dataclass(frozen=True)
class Replication:
    """A PostgreSQL primary's standbys, and whether its commits wait for one."""

    standbys: int  # streaming to it now (pg_stat_replication)
    synchronous: bool  # synchronous_standby_names set, and synchronous_commit not off or local


@dataclass(frozen=True)
class Galera:
    """A Galera node's cluster."""

    size: int  # wsrep_cluster_size
    conflicts: int  # certification failures and aborts by others' write sets, since it started


def replication(alias: str) -> Replication | None:
    """``alias``'s replication if it is a PostgreSQL primary; ``None`` otherwise."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        # Every role sees the rows of pg_stat_replication (not all their columns) and the
        # settings; a primary behind a service that hides its standbys shows none.
        cursor.execute(
            "SELECT pg_is_in_recovery(), current_setting('synchronous_standby_names'), "
            "current_setting('synchronous_commit'), (SELECT count(*) FROM pg_stat_replication)"
        )
        in_recovery, names, commit, standbys = cursor.fetchone()
    if in_recovery:
        return None
    waits = bool(names.strip()) and commit not in ("off", "local")
    return Replication(standbys=int(standbys), synchronous=waits)


def galera(alias: str) -> Galera | None:
    """``alias``'s Galera cluster if it is a node of one; ``None`` otherwise."""
    connection = connections[alias]
    if connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW VARIABLES LIKE 'wsrep\\_on'")  # no such variable on MySQL
        row = cursor.fetchone()
        if row is None or str(row[1]).upper() != "ON":
            return None
        cursor.execute(
            "SHOW GLOBAL STATUS WHERE Variable_name IN "
            "('wsrep_cluster_size', 'wsrep_local_cert_failures', 'wsrep_local_bf_aborts')"
        )
        status = {str(name).lower(): int(value) for name, value in cursor.fetchall()}
    return Galera(
        size=status.get("wsrep_cluster_size", 0),
        conflicts=status.get("wsrep_local_cert_failures", 0)
        + status.get("wsrep_local_bf_aborts", 0),
    )
