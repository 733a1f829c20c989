"""The project's settings, as `django-admin startproject` writes them (the admin, auth, sessions), with PostgreSQL
from PROJ_DATABASE_URL or DATABASE_URL and Celery on CELERY_BROKER_URL."""

import os
from urllib.parse import urlsplit

SECRET_KEY = "django-host-for-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "customers",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "proj.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
STATIC_URL = "static/"

# PROJ_DATABASE_URL, the project's own name for it, else DATABASE_URL (which the kit's live suite points at its proxy)
_database = urlsplit(os.environ.get("PROJ_DATABASE_URL") or os.environ["DATABASE_URL"])
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
