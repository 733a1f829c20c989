{%- set slug = cookiecutter.project_slug -%}
"""The kit's producer inside a Django project: the record in the project's transaction, the message after it.

    from django.db import transaction
    from {{ slug }}.django_app.producer import enqueue

    with transaction.atomic():
        order.save()
        enqueue(order.reference, {"email": order.email})  # sent when the transaction commits; rolled back: neither

The record is written through Django's own connection (`using`, the default one unless said), so it commits or
rolls back with the project's data, and the message goes by `transaction.on_commit`. Outside an atomic block
Django commits at once, and the message goes at once. The kit's claims run on Django's connection too
(store.py), so a worker finds the record where this wrote it.
"""

from __future__ import annotations

import functools
import re

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from .. import producer
from ..claims import CLOCKS, encode_details, fingerprint, insert_record, new_record, validate_details, validate_key


def enqueue(key: object, details: object = None, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Asks for one operation in the project's transaction on the connection `using`: its record, queued, now;
    its message once that transaction commits. BadMessage for a bad key or details, PayloadConflict for a known key
    with other details."""
    operation_key = validate_key(key)
    payload = validate_details(details)
    encoded = encode_details(payload)
    payload_fingerprint = fingerprint(operation_key, encoded)
    connection = connections[using]
    # the record's statement, with Django's parameter style (%(name)s) in place of SQLAlchemy's (:name)
    sql = re.sub(r":(\w+)", r"%(\1)s", insert_record("queued", 0, CLOCKS[connection.vendor].now))
    with connection.cursor() as cursor:
        cursor.execute(sql, new_record(operation_key, payload_fingerprint, encoded))
        written = cursor.fetchone() is not None
    if not written:
        producer.check_known(operation_key, payload_fingerprint)
    transaction.on_commit(functools.partial(producer.publish, operation_key, payload), using=using)
