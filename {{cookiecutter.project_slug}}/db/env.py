"""Alembic's environment: migrates the database of DATABASE_URL, the same one the job uses.

The kit's history is kept in a version table of its own, so it lives beside an application's Alembic history
in the same database: each `alembic upgrade head` reads and moves only its own table. The connection is the
kit's own (claims.connect): on SQLite it switches a new file to WAL here, once, before any worker opens it.
"""

from logging.config import fileConfig

from alembic import context

from {{ cookiecutter.project_slug }}.claims import connect
from {{ cookiecutter.project_slug }}.settings import database_url

# not `alembic_version`: that one belongs to the application's own history, if it has one
VERSION_TABLE = "{{ cookiecutter.project_slug }}_alembic_version"

if context.config.config_file_name is not None and context.config.attributes.get("configure_logger", True):
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)


def run_migrations_offline() -> None:
    context.configure(url=database_url(), literal_binds=True, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = connect()
    with engine.connect() as connection:
        context.configure(connection=connection, version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
