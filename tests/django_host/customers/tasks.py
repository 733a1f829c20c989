from celery import shared_task

from .models import Customer


@shared_task
def count_customers() -> int:
    """The project's own task, beside the kit's."""
    return Customer.objects.count()
