{%- from "replay_matrix.jinja" import max_key_length, states, states_added_in_3 with context -%}
{%- set t = cookiecutter.record_table -%}
{%- set MYSQL_TABLE = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4" -%}
{#- The record table's definition, as revision 0001 made it, under `name` and admitting `admitted` as statuses:
    revision 0003 rebuilds it on SQLite, which cannot change a CHECK in place. `mysql`: in MySQL's and MariaDB's
    types (see MYSQL below). -#}
{%- macro record_table(name, admitted, mysql=False) -%}
{%- set moment = "DATETIME(6)" if mysql else "TIMESTAMP WITH TIME ZONE" -%}
{%- set key = " COLLATE {key_collation}" if mysql else "" -%}
"""
    CREATE TABLE {{ name }} (
        job_type            VARCHAR(100){{ key }} NOT NULL,
        operation_key       VARCHAR({{ max_key_length }}){{ key }} NOT NULL,
        payload_fingerprint VARCHAR(64)  NOT NULL,
        payload             {{ "MEDIUMTEXT" if mysql else "TEXT" }},
        status              VARCHAR(16)  NOT NULL DEFAULT 'claimed',
        claim_token         VARCHAR(36)  NOT NULL,
        attempt             INTEGER      NOT NULL DEFAULT 1,
        claimed_at          {{ moment }} NOT NULL,
        completed_at        {{ moment }},
        note                TEXT,
        resolved_by         VARCHAR(255),
        resolved_at         {{ moment }},
        CONSTRAINT {{ t }}_status
            CHECK (status IN ({{ admitted }})),
        CONSTRAINT {{ t }}_operation UNIQUE (job_type, operation_key)
    ){{ MYSQL_TABLE if mysql else "" }}
    """
{%- endmacro -%}
{%- macro effects_table(mysql=False) -%}
"""
    CREATE TABLE {{ cookiecutter.job_type }}_effects (
        operation_key       VARCHAR({{ max_key_length }}){{ " COLLATE {key_collation}" if mysql else "" }} NOT NULL,
        payload             {{ "MEDIUMTEXT" if mysql else "TEXT" }}   NOT NULL,
        performed_at        {{ "DATETIME(6)" if mysql else "TIMESTAMP WITH TIME ZONE" }} NOT NULL
    ){{ MYSQL_TABLE if mysql else "" }}
    """
{%- endmacro -%}
{%- macro resolutions_table(mysql=False) -%}
{%- set key = " COLLATE {key_collation}" if mysql else "" -%}
"""
    CREATE TABLE {{ t }}_resolutions (
        job_type            VARCHAR(100){{ key }} NOT NULL,
        operation_key       VARCHAR({{ max_key_length }}){{ key }} NOT NULL,
        resolved_at         {{ "DATETIME(6)" if mysql else "TIMESTAMP WITH TIME ZONE" }} NOT NULL,
        resolved_by         VARCHAR(255) NOT NULL,
        resolved_as         VARCHAR(255) NOT NULL,
        database_role       VARCHAR(255),
        status_before       VARCHAR(16)  NOT NULL,
        status_after        VARCHAR(16)  NOT NULL,
        why                 TEXT         NOT NULL
    ){{ MYSQL_TABLE if mysql else "" }}
    """
{%- endmacro -%}
{%- set before_3 = "'claimed', 'completed', 'held', 'abandoned', 'released'" -%}
{%- set since_3 = states.keys()|map("tojson")|join(", ")|replace('"', "'") -%}
"""The kit's tables as SQL statements: the one source that the Alembic migrations (db/migrate/) and, in a Django
project, the Django migrations ({{ cookiecutter.project_slug }}/django_app/migrations/) both run; schema.sql (and, for
MySQL and MariaDB, schema-mysql.sql) says what they make together, with comments, and the replay suite checks that
they agree.

One revision per name, by database (`statements` picks them), each with what undoes it: a revision once released
stays as it is (it may have run at a client's), and a change to the tables is a new revision with its own.
PostgreSQL and SQLite share plain SQL; MySQL and MariaDB have their own types. Timestamps have no default: the claim
code writes them with the database's own clock.
"""

from __future__ import annotations

from typing import Any

# MySQL's and MariaDB's string comparison ignores trailing spaces and, by default, case: 'ORD-1' and 'ord-1 ' would
# be one operation. The key columns compare bytes, trailing spaces included (a NO PAD binary collation), as
# PostgreSQL and SQLite compare them; each server names that collation its own way.
KEY_COLLATION = {"mysql": "utf8mb4_0900_bin", "mariadb": "utf8mb4_nopad_bin"}


def statements(revision: dict[str, list[str]], dialect: Any) -> list[str]:
    """A revision's statements for the database of `dialect` (SQLAlchemy's; or a Django connection)."""
    name = getattr(dialect, "vendor", None) or dialect.name
    if name in ("mysql", "mariadb"):
        mariadb = bool(getattr(dialect, "mysql_is_mariadb", False) or getattr(dialect, "is_mariadb", False))
        collation = KEY_COLLATION["mariadb" if mariadb else "mysql"]
        return [statement.replace("{key_collation}", collation) for statement in revision["mysql"]]
    return revision[name]


# revision 0001: the record table
_CREATE = [
    {{ record_table(t, before_3) }},
    "CREATE INDEX {{ t }}_by_status ON {{ t }} (status, claimed_at)",
{%- if cookiecutter.effect_kind == "same_database" %}
    # the effect's own rows, written in the claim's transaction
    {{ effects_table() }},
{%- endif %}
]
CREATE = {
    "postgresql": _CREATE,
    "sqlite": _CREATE,
    "mysql": [
        {{ record_table(t, before_3, mysql=True)|indent(4) }},
        "CREATE INDEX {{ t }}_by_status ON {{ t }} (status, claimed_at)",
{%- if cookiecutter.effect_kind == "same_database" %}
        {{ effects_table(mysql=True)|indent(4) }},
{%- endif %}
    ],
}

# what undoes CREATE, in order (the same SQL everywhere)
_DROP = [
{%- if cookiecutter.effect_kind == "same_database" %}
    "DROP TABLE {{ cookiecutter.job_type }}_effects",
{%- endif %}
    "DROP TABLE {{ t }}",
]
DROP = {"postgresql": _DROP, "sqlite": _DROP, "mysql": _DROP}

# revision 0002: the sweeper's index holds the claimed rows only, a few kilobytes however many rows are completed;
# the first revision's index of every row by (status, claimed_at) goes. (On PostgreSQL the new index is built
# while writes to the table wait: it reads the table once, in seconds for a million rows, and keeps few entries.)
# MySQL and MariaDB have no partial index: theirs is (status, claimed_at), which finds the claimed rows, oldest
# first, as the partial one does, and the queued rows (revision 0003) too.
_CLAIMED_INDEX = [
    "DROP INDEX {{ t }}_by_status",
    """
    CREATE INDEX {{ t }}_claimed ON {{ t }} (claimed_at)
        WHERE status = 'claimed'
    """,
]
CLAIMED_INDEX = {
    "postgresql": _CLAIMED_INDEX,
    "sqlite": _CLAIMED_INDEX,
    "mysql": [
        "DROP INDEX {{ t }}_by_status ON {{ t }}",
        "CREATE INDEX {{ t }}_claimed ON {{ t }} (status, claimed_at)",
    ],
}

# what undoes CLAIMED_INDEX, in order
_CLAIMED_INDEX_UNDO = [
    "DROP INDEX {{ t }}_claimed",
    "CREATE INDEX {{ t }}_by_status ON {{ t }} (status, claimed_at)",
]
CLAIMED_INDEX_UNDO = {
    "postgresql": _CLAIMED_INDEX_UNDO,
    "sqlite": _CLAIMED_INDEX_UNDO,
    "mysql": [
        "DROP INDEX {{ t }}_claimed ON {{ t }}",
        "CREATE INDEX {{ t }}_by_status ON {{ t }} (status, claimed_at)",
    ],
}


# revision 0003: the send writes the record first, as `queued`, and an effect that fails past the queue's retries
# ends `failed`, for a person: the status CHECK admits both ({{ states_added_in_3|join(", ") }}), and the sweeper finds
# queued records that no run claimed (a message the broker lost) through an index of their own (MySQL and MariaDB:
# through revision 0002's). SQLite cannot change a CHECK in place, so it copies the table into one with the new CHECK.
QUEUED_AND_FAILED = {
    "postgresql": [
        "ALTER TABLE {{ t }} DROP CONSTRAINT {{ t }}_status",
        """
        ALTER TABLE {{ t }} ADD CONSTRAINT {{ t }}_status
            CHECK (status IN ({{ since_3 }}))
        """,
        """
        CREATE INDEX {{ t }}_queued ON {{ t }} (claimed_at)
            WHERE status = 'queued'
        """,
    ],
    "sqlite": [
        {{ record_table(t ~ "_rebuilt", since_3)|indent(4) }},
        "INSERT INTO {{ t }}_rebuilt SELECT * FROM {{ t }}",
        "DROP TABLE {{ t }}",
        "ALTER TABLE {{ t }}_rebuilt RENAME TO {{ t }}",
        """
        CREATE INDEX {{ t }}_claimed ON {{ t }} (claimed_at)
            WHERE status = 'claimed'
        """,
        """
        CREATE INDEX {{ t }}_queued ON {{ t }} (claimed_at)
            WHERE status = 'queued'
        """,
    ],
    "mysql": [
        "ALTER TABLE {{ t }} DROP CONSTRAINT {{ t }}_status",
        """
        ALTER TABLE {{ t }} ADD CONSTRAINT {{ t }}_status
            CHECK (status IN ({{ since_3 }}))
        """,
    ],
}

# What undoes QUEUED_AND_FAILED, in order. Revision 0002 knew neither state: a failed record goes back to
# `released` (its note keeps the error), and a queued one, which no run has claimed, is deleted.
_BACK_TO_2 = [
    "UPDATE {{ t }} SET status = 'released' WHERE status = 'failed'",
    "DELETE FROM {{ t }} WHERE status = 'queued'",
]
QUEUED_AND_FAILED_UNDO = {
    "postgresql": [
        *_BACK_TO_2,
        "DROP INDEX {{ t }}_queued",
        "ALTER TABLE {{ t }} DROP CONSTRAINT {{ t }}_status",
        """
        ALTER TABLE {{ t }} ADD CONSTRAINT {{ t }}_status
            CHECK (status IN ({{ before_3 }}))
        """,
    ],
    "sqlite": [
        *_BACK_TO_2,
        {{ record_table(t ~ "_rebuilt", before_3)|indent(4) }},
        "INSERT INTO {{ t }}_rebuilt SELECT * FROM {{ t }}",
        "DROP TABLE {{ t }}",
        "ALTER TABLE {{ t }}_rebuilt RENAME TO {{ t }}",
        """
        CREATE INDEX {{ t }}_claimed ON {{ t }} (claimed_at)
            WHERE status = 'claimed'
        """,
    ],
    "mysql": [
        *_BACK_TO_2,
        "ALTER TABLE {{ t }} DROP CONSTRAINT {{ t }}_status",
        """
        ALTER TABLE {{ t }} ADD CONSTRAINT {{ t }}_status
            CHECK (status IN ({{ before_3 }}))
        """,
    ],
}


# revision 0004: every resolution by a person, kept: the record says who resolved it last, this table every time
# (retention deletes completed records, never these).
_RESOLUTIONS_INDEX = """
    CREATE INDEX {{ t }}_resolutions_operation
        ON {{ t }}_resolutions (job_type, operation_key, resolved_at)
    """
_RESOLUTIONS = [
    {{ resolutions_table() }},
    _RESOLUTIONS_INDEX,
]
RESOLUTIONS = {
    "postgresql": _RESOLUTIONS,
    "sqlite": _RESOLUTIONS,
    "mysql": [
        {{ resolutions_table(mysql=True)|indent(4) }},
        _RESOLUTIONS_INDEX,
    ],
}

# what undoes RESOLUTIONS
_RESOLUTIONS_UNDO = ["DROP TABLE {{ t }}_resolutions"]
RESOLUTIONS_UNDO = {"postgresql": _RESOLUTIONS_UNDO, "sqlite": _RESOLUTIONS_UNDO, "mysql": _RESOLUTIONS_UNDO}
