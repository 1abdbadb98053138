"""The HTTP scenarios: each variant driven in alternating rounds against one server."""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from benchmarks.loadgen import Call, Reply, Sample, burst, drive
from benchmarks.server import PASSWORD, USER, Database
from benchmarks.stats import rotated


@dataclass(frozen=True)
class Variant:
    name: str
    path: str
    keyed: bool = True
    prepared: bool = False  # served by the server whose connections prepare statements
    cached: bool = False  # served by the server with this app's replay cache on
    method: str = "POST"  # GET: a read of one order, the path's {order} filled in


@dataclass(frozen=True)
class Target:
    host: str
    port: int


@dataclass(frozen=True)
class Servers:
    """The project served twice: as Django connects by default, and with prepared statements."""

    default: Target
    prepared: Target
    cached: Target | None = None  # Django's default connections, REPLAY_CACHE in Redis

    def of(self, variant: Variant) -> Target:
        if variant.cached:
            assert self.cached is not None
            return self.cached
        return self.prepared if variant.prepared else self.default


PLAIN = Variant("unprotected", "/bench/orders/plain/", keyed=False)
PLAIN_ATOMIC = Variant("unprotected, in a transaction", "/bench/orders/plain-atomic/", keyed=False)
OURS = Variant("idempotency (atomic)", "/api/orders/")
LEASE = Variant("idempotency (lease)", "/bench/orders/lease/")
# The two atomic-mode protocols on the same view (the unprotected twin with the mixin),
# side by side: the default (claim, work, finish) and the record written once (issue 32).
TWIN = Variant("idempotency (atomic), the twin", "/bench/orders/protected/")
WRITTEN_ONCE = Variant(
    "idempotency (atomic, written once), the twin", "/bench/orders/written-once/"
)
# A create as a real endpoint does it (benchmarks/views.py PlacedOrderCreate), with and without.
PLACED = Variant("placed order, unprotected", "/bench/orders/placed/", keyed=False)
PLACED_OURS = Variant("placed order, idempotency (atomic)", "/bench/orders/placed-protected/")
# Hot key only: a 2 s job in lease mode, its duplicates answered 409 or waiting for the outcome.
LEASE_SLOW = Variant("idempotency (lease, 2 s job)", "/bench/orders/lease-2s/")
LEASE_SLOW_WAITING = Variant(
    "idempotency (lease, 2 s job, duplicates wait)", "/bench/orders/lease-2s-wait/"
)
PREPARED = " (prepared statements)"
PLAIN_PREPARED = Variant(PLAIN.name + PREPARED, PLAIN.path, keyed=False, prepared=True)
OURS_PREPARED = Variant(OURS.name + PREPARED, OURS.path, prepared=True)
OURS_CACHED = Variant(OURS.name + " (replay cache)", OURS.path, cached=True)
# The floor of a replay's own stack: the cheapest request the same view set serves
# (/api/orders/, the example's ModelViewSet), an authenticated GET of one order, on
# each server that replays are measured on (a replay is compared on its own server).
ORDER_GET = Variant(
    "an order's GET (the same view set)", "/api/orders/{order}/", keyed=False, method="GET"
)
ORDER_GET_PREPARED = replace(ORDER_GET, name=ORDER_GET.name + PREPARED, prepared=True)
ORDER_GET_CACHED = replace(ORDER_GET, name=ORDER_GET.name + " (replay cache server)", cached=True)
ALTERNATIVES = {
    "drf-idempotencykey": Variant("drf-idempotencykey", "/bench/orders/drf-idempotencykey/"),
    "drf-idempotency": Variant("drf-idempotency", "/bench/orders/drf-idempotency/"),
    "django-idempotency-key": Variant(
        "django-idempotency-key", "/bench/orders/django-idempotency-key/"
    ),
}

_AUTHORIZATION = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def order_call(variant: Variant, key: str | None, sku: str = "bench") -> Call:
    headers = [
        ("Authorization", _AUTHORIZATION),
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
    ]
    if key is not None:
        headers.append(("Idempotency-Key", key))
    body = json.dumps({"sku": sku, "quantity": 1}).encode()
    return Call(path=variant.path, body=body, headers=tuple(headers))


def read_call(variant: Variant, order: int) -> Call:
    headers = (("Authorization", _AUTHORIZATION), ("Accept", "application/json"))
    return Call(variant.path.format(order=order), b"", headers, method=variant.method)


def fresh_calls(variant: Variant, count: int) -> tuple[list[Call], list[str]]:
    keys = [str(uuid.uuid4()) for _ in range(count)] if variant.keyed else []
    calls = [order_call(variant, keys[i] if keys else None) for i in range(count)]
    return calls, keys


def warm_up(servers: Servers, variants: Sequence[Variant], concurrency: int) -> None:
    """Let every worker open its database connection and import its code, unmeasured."""
    for variant in variants:
        calls, _ = fresh_calls(variant, concurrency * 4)
        _drive(servers, variant, calls, concurrency)


def _drive(servers: Servers, variant: Variant, calls: Sequence[Call], concurrency: int) -> Sample:
    target = servers.of(variant)
    return drive(target.host, target.port, calls, concurrency)


def first_requests(
    servers: Servers, variants: Sequence[Variant], rounds: int, count: int, concurrency: int
) -> tuple[dict[str, list[Sample]], dict[str, list[str]]]:
    """Creates with a new key each (none for the unprotected twin); returns the keys used."""
    samples: dict[str, list[Sample]] = defaultdict(list)
    keys: dict[str, list[str]] = defaultdict(list)
    for round_ in range(rounds):
        for variant in rotated(variants, round_):
            calls, used = fresh_calls(variant, count)
            samples[variant.name].append(_drive(servers, variant, calls, concurrency))
            keys[variant.name].extend(used)
    return samples, keys


def replays(
    servers: Servers,
    variants: Sequence[Variant],
    recorded: dict[str, list[str]],
    rounds: int,
    count: int,
    concurrency: int,
    reads: Sequence[Variant] = (),
    order: int = 0,
) -> dict[str, list[Sample]]:
    """Repeats of recorded keys (same body), alternating with fresh creates on our endpoint.

    Each of this app's variants is also driven with fresh keys on its own
    server, so that replays and creates are compared under the same connections;
    ``reads`` (GETs of the order ``order``) alternate with them too, the floor of the stack.
    """
    fresh = [
        replace(variant, name=f"{variant.name}, fresh keys")
        for variant in variants
        if variant.path in (OURS.path, PLACED_OURS.path, TWIN.path, WRITTEN_ONCE.path)
    ]
    replayed = [replace(variant, name=f"{variant.name}, replays") for variant in variants]
    sources = dict(zip([v.name for v in replayed], variants, strict=True))
    samples: dict[str, list[Sample]] = defaultdict(list)
    rng = random.Random(6)
    for round_ in range(rounds):
        for variant in rotated([*fresh, *replayed, *reads], round_):
            if variant in reads:
                calls = [read_call(variant, order)] * count
            elif variant in fresh:
                calls, _ = fresh_calls(variant, count)
            else:
                source = sources[variant.name]
                keys = rng.choices(recorded[source.name], k=count)
                calls = [order_call(source, key) for key in keys]
            samples[variant.name].append(_drive(servers, variant, calls, concurrency))
    return samples


@dataclass
class HotKey:
    """Bursts of simultaneous requests: duplicates of one key, or distinct keys."""

    latencies: list[float] = field(default_factory=list)  # every reply, milliseconds
    executed: list[float] = field(default_factory=list)  # replies not marked as replays
    statuses: Counter[int] = field(default_factory=Counter)
    failures: int = 0
    effects: list[int] = field(default_factory=list)  # orders created, per burst
    answered: list[int] = field(default_factory=list)  # 2xx replies, per burst

    @property
    def score(self) -> float:
        """Share of replies that carried the outcome (2xx), in bursts with exactly one effect."""
        good = sum(ok for ok, made in zip(self.answered, self.effects, strict=True) if made == 1)
        total = len(self.latencies) + self.failures
        return good / total if total else 0.0

    def add(self, replies: Sequence[Reply | None]) -> None:
        self.answered.append(sum(1 for r in replies if r is not None and 200 <= r.status < 300))
        for reply in replies:
            if reply is None:
                self.failures += 1
                continue
            self.latencies.append(reply.seconds * 1000)
            self.statuses[reply.status] += 1
            if 200 <= reply.status < 300 and not reply.replayed:
                self.executed.append(reply.seconds * 1000)


def hot_keys(
    servers: Servers,
    database: Database,
    variants: Sequence[Variant],
    trials: int,
    size: int,
) -> dict[str, HotKey]:
    """``size`` simultaneous duplicates per variant and trial, and a burst of distinct keys."""
    distinct = Variant(f"{OURS.name}, {size} distinct keys", OURS.path)
    results: dict[str, HotKey] = defaultdict(HotKey)
    for trial in range(trials):
        for variant in rotated([distinct, *variants], trial):
            sku = f"hot-{trial}-{uuid.uuid4().hex[:12]}"
            if variant is distinct:
                calls = [order_call(variant, str(uuid.uuid4()), sku) for _ in range(size)]
            else:
                key = str(uuid.uuid4())
                calls = [order_call(variant, key, sku) for _ in range(size)]
            result = results[variant.name]
            target = servers.of(variant)
            result.add(burst(target.host, target.port, calls))
            result.effects.append(
                int(database.scalar("SELECT count(*) FROM shop_order WHERE sku = %s", sku))
            )
    return results
