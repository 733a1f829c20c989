"""The claim store on Django's own database connection: in a Django project the kit needs no DATABASE_URL.

Each thread's claims run on that thread's Django connection (`connections["default"]`), so what Django does is what
the kit does: a record written inside the project's transaction commits or rolls back with it, and a same-database
effect's claim, effect and completion share one `transaction.atomic`, in which the effect may write through the
ORM. Outside a transaction Django's connection is in autocommit, and a claim commits on its own before the effect,
as on DATABASE_URL. Django opens and closes that connection (CONN_MAX_AGE); the kit only asks for it.

The questions about the whole table (status, held) and the worker's start-up check use connections of their own,
made by Django's backend from the same DATABASES entry.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db import Error as DjangoDatabaseError
from sqlalchemy import Connection, exc
from sqlalchemy.pool import NullPool

from ..claims import ClaimStore, HeldConnection, connect


def sqlalchemy_url(alias: str) -> str:
    """The SQLAlchemy dialect of the DBAPI that Django's backend uses for `alias` (the SQL is compiled for it)."""
    wrapper = connections[alias]
    if wrapper.vendor == "postgresql":
        return "postgresql+psycopg://" if wrapper.Database.__name__ == "psycopg" else "postgresql+psycopg2://"
    if wrapper.vendor == "sqlite":
        return "sqlite://"
    raise ImproperlyConfigured(
        f"DATABASES[{alias!r}] is {wrapper.vendor}: the kit's claims run on PostgreSQL or SQLite"
    )


class _DjangosConnection(HeldConnection):
    """A thread's Django connection, as the store holds it: Django's to open and close."""

    __slots__ = ("alias",)

    def __init__(self, pooled: Any, alias: str) -> None:
        super().__init__(pooled)
        self.alias = alias

    def alive(self) -> bool:
        # Django may have closed or replaced it since (after each task, as CONN_MAX_AGE says)
        return connections[self.alias].connection is self.connection and super().alive()

    def close(self) -> None:
        # a connection found lost: Django's to close (in an atomic block, Django rolls back at its end)
        if self.pid == os.getpid() and connections[self.alias].connection is self.connection:
            with contextlib.suppress(Exception):
                connections[self.alias].close()

    def __del__(self) -> None:
        """Dropping it leaves Django's connection to Django."""


class DjangoClaimStore(ClaimStore):
    """The ClaimStore on Django's connection `alias`."""

    def __init__(self, alias: str = DEFAULT_DB_ALIAS) -> None:
        self.alias = alias
        backend = connections[alias]
        super().__init__(
            connect(sqlalchemy_url(alias), creator=lambda: backend.get_new_connection(backend.get_connection_params()))
        )

    @contextlib.contextmanager
    def _django_errors(self) -> Iterator[None]:
        """Django's database errors as SQLAlchemy's, which the job and the queue's retry know (an outage retried,
        a missing table named for a person)."""
        try:
            yield
        except DjangoDatabaseError as error:
            orig = error.__cause__ if isinstance(error.__cause__, self._dbapi.Error) else error
            raise exc.DBAPIError.instance(None, None, orig, self._dbapi.Error, dialect=self.engine.dialect) from error

    def _open(self) -> HeldConnection:
        wrapper = connections[self.alias]
        with self._django_errors():
            wrapper.ensure_connection()
        # SQLAlchemy's wrapper of Django's DBAPI connection, for a same-database effect's Connection; out of any pool
        pooled = NullPool(lambda: wrapper.connection).connect()
        pooled.detach()
        return _DjangosConnection(pooled, self.alias)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """Django's transaction.atomic: the store's statements, the effect's through the Connection it yields and
        the ORM's all run in it; it commits at the end (or, nested in the project's, with the project's), and rolls
        back when anything raised."""
        with self._django_errors(), transaction.atomic(using=self.alias):
            held = self._local.transaction = self._held()
            try:
                yield Connection(self.engine, held.pooled)
            finally:
                self._local.transaction = None
