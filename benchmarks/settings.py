"""Benchmark settings: the example project plus benchmark-only twin endpoints.

The twins (``benchmarks/urls.py``) serve the same order create as
``/api/orders/`` unprotected, in lease mode, and behind each alternative
package that is installed (``benchmarks/alternatives.py`` puts them on the
path of the benchmark server only). Nothing here is used outside benchmarks.
"""

from importlib.util import find_spec

from example_project.settings import *  # noqa: F403
from example_project.settings import DATABASES, INSTALLED_APPS, MIDDLEWARE, env

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "benchmarks.urls"

# Persistent connections, as a production deployment keeps them: a new
# PostgreSQL connection per request would cost more than everything measured.
DATABASES["default"]["CONN_MAX_AGE"] = 300

if env.bool("BENCH_PREPARED", default=False):
    # The run's second server: psycopg 3 binds every statement server-side and
    # prepares it after 5 runs, Django's and this app's alike, as a deployment
    # without a transaction-mode connection pooler may (Django leaves it off).
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "server_side_binding": True,
        "prepare_threshold": 5,
    }

# HTTP Basic checks the password on every request. PBKDF2 at Django's default
# cost takes half a second of CPU here and would hide every difference
# measured here; a cheap hasher keeps the request stack lean (benchmark only!).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# No sessions or CSRF are used by the API callers (HTTP Basic), but the
# example's middleware stays as it is: every endpoint pays for it alike.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": ["console"], "level": "WARNING"}},
}

# drf-idempotency reads ``settings.IDEMPOTENCY`` too (the same name as this
# app's) and refuses keys it does not know, such as LOCK_TIMEOUT. Leave it
# empty so that both packages run on their defaults (LOCK_TIMEOUT is 2 s either way).
IDEMPOTENCY: dict[str, object] = {}

ALTERNATIVES = {
    # package -> what its docs say to add to INSTALLED_APPS
    "drf_idempotencykey": ["drf_idempotencykey"],
    "drf_idempotency": ["drf_idempotency"],
    "idempotency_key": [],
}
INSTALLED = [name for name in ALTERNATIVES if find_spec(name) is not None]
INSTALLED_APPS = [*INSTALLED_APPS, *(app for name in INSTALLED for app in ALTERNATIVES[name])]

REDIS_URL = env.str("BENCH_REDIS_URL", default="redis://127.0.0.1:6379/13")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

if env.bool("BENCH_REPLAY_CACHE", default=False):
    # The run's third server: this app's replay cache on, in Redis (Django's own
    # backend). drf-idempotency would refuse this IDEMPOTENCY dict, so its twin
    # is never requested from this server.
    CACHES["replays"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "replays-" + env.str("BENCH_RUN_ID", default="bench"),
    }
    IDEMPOTENCY = {"REPLAY_CACHE": "replays"}

if "idempotency_key" in INSTALLED:
    # django-idempotency-key's docs for several processes: responses in a shared
    # cache, and a Redis lock around the lookup; the opt-in middleware variant.
    MIDDLEWARE = [*MIDDLEWARE, "idempotency_key.middleware.ExemptIdempotencyKeyMiddleware"]
    CACHES["idempotency"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env.str("BENCH_RUN_ID", default="bench"),
    }
    IDEMPOTENCY_KEY = {
        "CONFLICT_STATUS_CODE": None,  # replay with the original status, like the others
        "STORAGE": {
            "CLASS": "idempotency_key.storage.CacheKeyStorage",
            "CACHE_NAME": "idempotency",
        },
        "LOCK": {
            "CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock",
            "LOCATION": REDIS_URL,
            "NAME": "bench-idempotency-key-lock-" + env.str("BENCH_RUN_ID", default="bench"),
            "TTL": 30,
            # The same bound on waiting as this app's LOCK_TIMEOUT. With the default
            # 0.1 s, most requests under this load were answered 423 Locked.
            "TIMEOUT": 2.0,
        },
    }
