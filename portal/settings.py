"""Portal settings, read from the environment with defaults for the embedded single-machine setup.

Production sets ``DATABASE_URL`` (PostgreSQL), ``REDIS_URL``, ``MODEL_CACHE_ROOT`` (the FSx mount)
and ``SECRET_KEY``; the defaults give a SQLite file and a model cache under ``./var/``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PORTAL_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str], sep: str = ",") -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(sep) if item.strip()]


def _secret_key(debug: bool) -> str:
    """A key from the environment; in development one generated once and kept under ``var/``."""
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    if not debug:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment when DEBUG is off.")
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env_bool("DEBUG", default=False)
SECRET_KEY = _secret_key(DEBUG)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "portal.core",
    "portal.accounts",
    "portal.registry",
    "portal.deployments",
    "portal.cache",
    "portal.api",
    "portal.metrics",
    "portal.web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.metrics.middleware.RequestMetricsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.web.context_processors.teams",
            ],
        },
    },
]

if "DATABASE_URL" not in os.environ:
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # the embedded default keeps its SQLite file here
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'portal.sqlite3'}",
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The embedded default: web, worker and beat write one file. A transaction takes the write
    # lock when it begins and waits up to 20 s for it; SQLite's default (a deferred
    # transaction upgrading its read lock) fails at once with "database is locked" when two
    # tasks write together, e.g. two versions packaged at the same time. WAL lets readers go
    # on while one writes.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL;",
    }
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("TEST_DATABASE_NAME", "test_portal")}
    #: A connection pool of at most this many connections per process (0: none, a connection
    #: per thread). The web server sets it (portal/asgi.py): there every request runs on a
    #: thread of its own, and a burst of requests would otherwise open a connection each until
    #: PostgreSQL refuses more. A request that finds the pool empty waits up to 30 s for one.
    DATABASE_POOL_MAX_SIZE = int(os.environ.get("DATABASE_POOL_MAX_SIZE", "0"))
    if DATABASE_POOL_MAX_SIZE > 0:
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # a closed connection goes back to the pool
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": DATABASE_POOL_MAX_SIZE,
            "timeout": 30,
        }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:home"
LOGOUT_REDIRECT_URL = "web:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]

# Production serves over HTTPS (usually behind a TLS-terminating proxy); DEBUG, or
# SECURE_COOKIES=0 (docker/compose.yaml on plain http://127.0.0.1), turns every default below
# off at once, and each variable can still be set on its own.
HTTPS = not DEBUG and env_bool("SECURE_COOKIES", default=True)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", default=HTTPS)
#: Probes and the metrics scraper reach these over plain HTTP inside the cluster; a redirect
#: to https:// would fail them (patterns match the path without its leading slash).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$", r"^metrics$"]
SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(31536000 if HTTPS else 0)))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=HTTPS)
#: Off unless asked: the preload list is a commitment of the whole registered domain, which the
#: owner of that domain makes, not the portal on one of its subdomains.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", default=False)
#: The header through which the TLS-terminating proxy says the client used HTTPS; without it,
#: SECURE_SSL_REDIRECT behind such a proxy would redirect forever. Blank: no proxy is trusted.
_proxy_ssl_header = os.environ.get("SECURE_PROXY_SSL_HEADER", "X-Forwarded-Proto" if HTTPS else "")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.strip().upper().replace("-", "_"), "https")
    if _proxy_ssl_header.strip()
    else None
)
# The deploy check's advice to set SECURE_HSTS_PRELOAD (see above) is a decision left to the
# domain's owner.
SILENCED_SYSTEM_CHECKS = ["security.W021"]

# --- Platform -------------------------------------------------------------------------------

#: Where materialized weights and model packages live (an FSx for Lustre mount in production).
MODEL_CACHE_ROOT = Path(os.environ.get("MODEL_CACHE_ROOT", VAR_DIR / "model-cache")).resolve()

#: Author plugin wheels (portal/registry/plugins.py): the most one wheel may weigh, and all of a
#: version's wheels together; the serving image's installed packages, which a wheel's
#: Requires-Dist must be satisfied by (the pinned-version rule).
PLUGIN_WHEEL_MAX_BYTES = int(os.environ.get("PLUGIN_WHEEL_MAX_BYTES", str(64 * 1024 * 1024)))
PLUGIN_WHEELS_MAX_TOTAL_BYTES = int(
    os.environ.get("PLUGIN_WHEELS_MAX_TOTAL_BYTES", str(192 * 1024 * 1024))
)
SERVING_IMAGE_PACKAGES_FILE = Path(
    os.environ.get(
        "SERVING_IMAGE_PACKAGES_FILE", BASE_DIR / "docker" / "serving-image-packages.txt"
    )
)

#: Open log follows (``GET .../logs/?follow=1``) one web process holds, per user and in all;
#: one past either is answered 429 (portal/api/log_follow.py). A follow waits on the event
#: loop, so the total bounds memory and sockets, not threads.
LOG_FOLLOWS_PER_USER = int(os.environ.get("LOG_FOLLOWS_PER_USER", "20"))
LOG_FOLLOWS_PER_PROCESS = int(os.environ.get("LOG_FOLLOWS_PER_PROCESS", "500"))
#: The largest request body the ASGI server lets through to Django (portal/asgi.py), which
#: would otherwise spool any body whole before a view or a limit sees it: a plugin wheel at
#: its limit, with room for the multipart envelope.
WEB_MAX_BODY_BYTES = int(
    os.environ.get("WEB_MAX_BODY_BYTES", str(PLUGIN_WHEEL_MAX_BYTES + 1024 * 1024))
)

#: ``file://`` artifact sources must resolve under one of these directories.
ARTIFACT_FILE_ROOTS = [
    Path(p).resolve()
    for p in env_list("ARTIFACT_FILE_ROOTS", [str(VAR_DIR / "artifacts")], sep=os.pathsep)
]
#: Whether registering a ``file://`` source checks that it exists (a file, or a directory
#: holding files). Turn it off only where the portal does not mount the roots its workers copy
#: from; then a missing path fails the version's copy instead.
ARTIFACT_FILE_CHECK_ON_REGISTER = env_bool("ARTIFACT_FILE_CHECK_ON_REGISTER", True)

# The model cache (portal/cache). Sources read their credentials from the environment the way
# their libraries do: AWS_* (and AWS_ENDPOINT_URL_S3 for any S3-compatible store) for s3://,
# HF_TOKEN / HF_ENDPOINT / HF_HUB_OFFLINE for hf://.
#: Size the cache is kept within by evicting unused, unpinned versions (0 = unbounded).
MODEL_CACHE_MAX_BYTES = int(os.environ.get("MODEL_CACHE_MAX_BYTES", "0"))
#: Parallel ranged GETs per S3 object, and the size of each range.
MODEL_CACHE_PARALLELISM = int(os.environ.get("MODEL_CACHE_PARALLELISM", "8"))
MODEL_CACHE_PART_SIZE = int(os.environ.get("MODEL_CACHE_PART_SIZE", str(16 * 1024 * 1024)))
#: Bandwidth cap for one copy, in bytes per second (0 = none).
MODEL_CACHE_MAX_BYTES_PER_SECOND = int(os.environ.get("MODEL_CACHE_MAX_BYTES_PER_SECOND", "0"))
#: A copy's Redis lease expires this long after its worker stops renewing it.
MODEL_CACHE_LEASE_SECONDS = int(os.environ.get("MODEL_CACHE_LEASE_SECONDS", "60"))
MODEL_CACHE_PROGRESS_INTERVAL = float(os.environ.get("MODEL_CACHE_PROGRESS_INTERVAL", "1.0"))
#: A deployment finished less than this long ago still protects its versions from eviction.
MODEL_CACHE_RECENT_USE_SECONDS = int(os.environ.get("MODEL_CACHE_RECENT_USE_SECONDS", "86400"))
#: Staging areas (partial copies) of versions nobody retried are removed this long after the
#: copy last failed or the version was deleted; until then they count in the cache's usage.
MODEL_CACHE_STAGING_GRACE_SECONDS = int(
    os.environ.get("MODEL_CACHE_STAGING_GRACE_SECONDS", str(2 * 86400))
)
# FSx for Lustre mode (portal/cache/fsx_copy.py): set the file system id and s3:// versions are
# imported through its data repository association and restored with ``lfs hsm_restore`` on the
# file system itself instead of being streamed through a worker. ``MODEL_CACHE_ROOT`` must be a
# directory on that file system (hard links join the restored files to the cache's blobs).
MODEL_CACHE_FSX_FILE_SYSTEM_ID = os.environ.get("MODEL_CACHE_FSX_FILE_SYSTEM_ID", "")
#: The buckets whose versions go through FSx (comma-separated; empty: every bucket). Versions in
#: other buckets are copied through a worker as without FSx.
MODEL_CACHE_FSX_BUCKETS = env_list("MODEL_CACHE_FSX_BUCKETS", [])
#: Where the Lustre client mounts that file system on the workers (``mount -t lustre ... /fsx``).
MODEL_CACHE_FSX_MOUNT = Path(os.environ.get("MODEL_CACHE_FSX_MOUNT", "/fsx"))
#: The Lustre client's ``lfs`` command.
MODEL_CACHE_FSX_LFS = os.environ.get("MODEL_CACHE_FSX_LFS", "lfs")
#: How long an import task plus the restores of one version may take, and how often to look.
MODEL_CACHE_FSX_TIMEOUT_SECONDS = float(os.environ.get("MODEL_CACHE_FSX_TIMEOUT_SECONDS", "7200"))
MODEL_CACHE_FSX_POLL_SECONDS = float(os.environ.get("MODEL_CACHE_FSX_POLL_SECONDS", "5"))
#: Where huggingface_hub downloads hf:// sources before they are copied into the cache.
HF_HUB_CACHE_DIR = Path(os.environ.get("HF_HUB_CACHE_DIR", VAR_DIR / "hf-hub")).resolve()

# --- Rollouts (portal/deployments) ------------------------------------------------------------

#: Where instances run: ``local`` (serving processes on this machine, behind the local gateway)
#: or ``kubernetes``.
INSTANCE_LAUNCHER = os.environ.get("INSTANCE_LAUNCHER", "local")
#: Local launcher: one directory per instance (its pid record, log and work directory).
INSTANCE_RUN_ROOT = Path(os.environ.get("INSTANCE_RUN_ROOT", VAR_DIR / "instances")).resolve()
#: Where instances are containers (Kubernetes), the serving image built from
#: docker/serving.Dockerfile, tagged with the platform release's name.
SERVING_IMAGE_REPOSITORY = os.environ.get("SERVING_IMAGE_REPOSITORY", "llm-serving/serving")
#: Kubernetes launcher: the namespace instances run in, the PersistentVolumeClaim of the model
#: cache (FSx for Lustre through its CSI driver in production; see docs/operations.md), and
#: the Gateway API Gateway that HTTPRoutes attach to (blank: Services only, no HTTPRoutes).
KUBERNETES_NAMESPACE = os.environ.get("KUBERNETES_NAMESPACE", "llm-serving")
KUBERNETES_MODEL_CACHE_PVC = os.environ.get("KUBERNETES_MODEL_CACHE_PVC", "model-cache")
KUBERNETES_GATEWAY_NAME = os.environ.get("KUBERNETES_GATEWAY_NAME", "")
KUBERNETES_GATEWAY_NAMESPACE = os.environ.get("KUBERNETES_GATEWAY_NAMESPACE", "")
#: How long a stopped instance may take to finish its in-flight requests.
INSTANCE_DRAIN_SECONDS = float(os.environ.get("INSTANCE_DRAIN_SECONDS", "30"))
#: The local gateway's public URL, shown to callers (``serving.gateway``).
GATEWAY_URL = os.environ.get("GATEWAY_URL", "http://127.0.0.1:8080").rstrip("/")
#: The Redis key prefix the gateway's routing table lives under.
GATEWAY_REDIS_PREFIX = os.environ.get("GATEWAY_REDIS_PREFIX", "gateway")
#: While a rollout waits for something, it looks again this often.
RECONCILE_INTERVAL_SECONDS = float(os.environ.get("RECONCILE_INTERVAL_SECONDS", "0.5"))
#: A deployment at rest (serving) is checked this often, to replace crashed instances.
RECONCILE_IDLE_INTERVAL_SECONDS = float(os.environ.get("RECONCILE_IDLE_INTERVAL_SECONDS", "5"))
#: Beat re-drives a live deployment not reconciled for this long (its worker died).
RECONCILE_STALE_SECONDS = float(os.environ.get("RECONCILE_STALE_SECONDS", "20"))
#: Self-healing (``portal.deployments.state.healing``): a lost instance of a serving set is started
#: again after a back-off that doubles with each failure of its version in the crash-loop window,
#: from INSTANCE_RESTART_BACKOFF_SECONDS up to INSTANCE_RESTART_BACKOFF_MAX_SECONDS. After
#: CRASH_LOOP_FAILURES failures within CRASH_LOOP_WINDOW_SECONDS the version is in a crash loop and
#: is not started again until the oldest of them leaves the window.
INSTANCE_RESTART_BACKOFF_SECONDS = float(os.environ.get("INSTANCE_RESTART_BACKOFF_SECONDS", "2"))
INSTANCE_RESTART_BACKOFF_MAX_SECONDS = float(
    os.environ.get("INSTANCE_RESTART_BACKOFF_MAX_SECONDS", "60")
)
CRASH_LOOP_FAILURES = int(os.environ.get("CRASH_LOOP_FAILURES", "5"))
CRASH_LOOP_WINDOW_SECONDS = float(os.environ.get("CRASH_LOOP_WINDOW_SECONDS", "600"))
#: A serving instance that fails its health check for this long is drained and replaced.
UNHEALTHY_REPLACE_SECONDS = float(os.environ.get("UNHEALTHY_REPLACE_SECONDS", "30"))
#: The error rate of a bake is judged only once the new version served this many requests.
ROLLOUT_MIN_REQUESTS = int(os.environ.get("ROLLOUT_MIN_REQUESTS", "10"))
#: A bake whose canary analysis has too few requests is lengthened by another bake this many
#: times at most; then the rollout holds for a person (``portal.deployments.rollout.canary``).
CANARY_MAX_BAKE_EXTENSIONS = int(os.environ.get("CANARY_MAX_BAKE_EXTENSIONS", "3"))
#: A Versioned deployment that is not its model's newest and had no request for this long is
#: retired by the cleanup task.
VERSIONED_IDLE_SECONDS = int(os.environ.get("VERSIONED_IDLE_SECONDS", str(24 * 3600)))

#: How long a stored ``Idempotency-Key`` answer is replayed before it is purged.
IDEMPOTENCY_KEY_TTL_SECONDS = int(os.environ.get("IDEMPOTENCY_KEY_TTL_SECONDS", str(24 * 3600)))

# --- Metrics ----------------------------------------------------------------------------------

#: How often beat scrapes every live instance's /metrics, how long one scrape may take, and how
#: long the per-deployment points are kept.
METRICS_SCRAPE_SECONDS = float(os.environ.get("METRICS_SCRAPE_SECONDS", "15"))
METRICS_SCRAPE_TIMEOUT_SECONDS = float(os.environ.get("METRICS_SCRAPE_TIMEOUT_SECONDS", "2"))
METRICS_RETENTION_SECONDS = int(os.environ.get("METRICS_RETENTION_SECONDS", str(24 * 3600)))

# --- Celery on Redis --------------------------------------------------------------------------

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", REDIS_URL)
# Workers consume this queue and tasks go to it: two platforms (or two test runs) sharing one Redis
# database stay apart by each naming its own.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "celery")
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_EXPIRES = 3600
# A task is acknowledged only after it finished, so a worker killed midway hands it to another.
# Every task is written to be idempotent for exactly this reason.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = int(os.environ.get("CELERY_TASK_SOFT_TIME_LIMIT", "3000"))
CELERY_TASK_TIME_LIMIT = int(os.environ.get("CELERY_TASK_TIME_LIMIT", "3600"))
# Must exceed the longest task (hard limit), or Redis redelivers a task that is still running.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_TASK_TIME_LIMIT + 600}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "beat-heartbeat": {"task": "portal.core.tasks.beat_heartbeat", "schedule": 15.0},
    "redrive-materializations": {
        "task": "portal.cache.tasks.redrive_materializations",
        "schedule": 60.0,
    },
    "evict-model-cache": {"task": "portal.cache.tasks.evict_model_cache", "schedule": 600.0},
    "clean-up-model-cache-staging": {
        "task": "portal.cache.tasks.clean_up_staging",
        "schedule": 3600.0,
    },
    "redrive-deployments": {
        "task": "portal.deployments.tasks.redrive_deployments",
        "schedule": 3.0,
    },
    "publish-routes": {"task": "portal.deployments.tasks.publish_routes", "schedule": 60.0},
    "publish-caller-keys": {
        "task": "portal.deployments.tasks.publish_caller_keys",
        "schedule": 60.0,
    },
    "clean-up-versioned": {
        "task": "portal.deployments.tasks.clean_up_versioned",
        "schedule": 300.0,
    },
    "purge-idempotency-keys": {
        "task": "portal.core.tasks.purge_expired_idempotency_keys",
        "schedule": 3600.0,
    },
    "scrape-metrics": {
        "task": "portal.metrics.tasks.scrape_metrics",
        "schedule": float(METRICS_SCRAPE_SECONDS),
    },
}
#: Beat is considered dead when its heartbeat is older than this.
BEAT_HEARTBEAT_MAX_AGE_SECONDS = int(os.environ.get("BEAT_HEARTBEAT_MAX_AGE_SECONDS", "60"))

# --- API --------------------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["portal.api.parsers.BoundedJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.PagePagination",
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "portal.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "LLM serving platform API",
    "DESCRIPTION": "Register models and versions, deploy them, and watch rollouts from CI.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.schema.declare_errors",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several models have a ``state``: name each enum after its own state machine.
    "ENUM_NAME_OVERRIDES": {
        "InstanceStateEnum": "portal.deployments.models.InstanceState",
        "VersionStateEnum": "portal.registry.models.VersionState",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

#: Constraint plugins (vLLM logits processors, checked at instance start; the names map to
#: classes in serving/instance/plugins.py) that a version may ask for. Operators extend this
#: list as they add plugins.
CONSTRAINT_PLUGINS = env_list("CONSTRAINT_PLUGINS", ["platform-constraints"])
