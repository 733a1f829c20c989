# Celery's Django layout: the app is loaded with Django, so that shared tasks use it.
from .celery import app as celery_app

__all__ = ("celery_app",)
