"""The project's settings: PostgreSQL from DATABASE_URL, Celery on CELERY_BROKER_URL."""

import os
from urllib.parse import urlsplit

SECRET_KEY = "django-host-for-tests-only"
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "customers",
]

_database = urlsplit(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.path.lstrip("/"),
        "USER": _database.username or "",
        "PASSWORD": _database.password or "",
        "HOST": _database.hostname or "",
        "PORT": str(_database.port or ""),
    }
}

CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
# Results where the broker keeps them: in Redis, or through RabbitMQ as replies (Celery 5 stores none in amqp://).
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or (
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else "rpc://"
)
