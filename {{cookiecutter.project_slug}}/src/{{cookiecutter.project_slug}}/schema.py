{%- from "replay_matrix.jinja" import max_key_length, states, states_added_in_3 with context -%}
{%- set t = cookiecutter.record_table -%}
{#- The record table's definition, as revision 0001 made it, under `name` and admitting `admitted` as statuses:
    revision 0003 rebuilds it on SQLite, which cannot change a CHECK in place. -#}
{%- macro record_table(name, admitted) -%}
"""
    CREATE TABLE {{ name }} (
        job_type            VARCHAR(100) NOT NULL,
        operation_key       VARCHAR({{ max_key_length }}) NOT NULL,
        payload_fingerprint VARCHAR(64)  NOT NULL,
        payload             TEXT,
        status              VARCHAR(16)  NOT NULL DEFAULT 'claimed',
        claim_token         VARCHAR(36)  NOT NULL,
        attempt             INTEGER      NOT NULL DEFAULT 1,
        claimed_at          TIMESTAMP WITH TIME ZONE NOT NULL,
        completed_at        TIMESTAMP WITH TIME ZONE,
        note                TEXT,
        resolved_by         VARCHAR(255),
        resolved_at         TIMESTAMP WITH TIME ZONE,
        CONSTRAINT {{ t }}_status
            CHECK (status IN ({{ admitted }})),
        CONSTRAINT {{ t }}_operation UNIQUE (job_type, operation_key)
    )
    """
{%- endmacro -%}
{%- set before_3 = "'claimed', 'completed', 'held', 'abandoned', 'released'" -%}
{%- set since_3 = states.keys()|map("tojson")|join(", ")|replace('"', "'") -%}
"""The kit's tables as SQL statements: the one source that the Alembic migrations (db/migrate/) and, in a Django
project, the Django migrations ({{ cookiecutter.project_slug }}/django_app/migrations/) both run; schema.sql says
what they make together, with comments, and the replay suite checks that the two agree.

One list per revision, each with what undoes it: a revision once released stays as it is (it may have run at a
client's), and a change to the tables is a new revision with its own. Plain SQL that runs on PostgreSQL and
SQLite alike. Timestamps have no default: the claim code writes them with the database's own clock.
"""

# revision 0001: the record table
CREATE = [
    {{ record_table(t, before_3) }},
    "CREATE INDEX {{ t }}_by_status ON {{ t }} (status, claimed_at)",
{%- if cookiecutter.effect_kind == "same_database" %}
    # the effect's own rows, written in the claim's transaction
    """
    CREATE TABLE {{ cookiecutter.job_type }}_effects (
        operation_key       VARCHAR({{ max_key_length }}) NOT NULL,
        payload             TEXT         NOT NULL,
        performed_at        TIMESTAMP WITH TIME ZONE NOT NULL
    )
    """,
{%- endif %}
]

# what undoes CREATE, in order
DROP = [
{%- if cookiecutter.effect_kind == "same_database" %}
    "DROP TABLE {{ cookiecutter.job_type }}_effects",
{%- endif %}
    "DROP TABLE {{ t }}",
]

# revision 0002: the sweeper's index holds the claimed rows only, a few kilobytes however many rows are completed;
# the first revision's index of every row by (status, claimed_at) goes. (On PostgreSQL the new index is built
# while writes to the table wait: it reads the table once, in seconds for a million rows, and keeps few entries.)
CLAIMED_INDEX = [
    "DROP INDEX {{ t }}_by_status",
    """
    CREATE INDEX {{ t }}_claimed ON {{ t }} (claimed_at)
        WHERE status = 'claimed'
    """,
]

# what undoes CLAIMED_INDEX, in order
CLAIMED_INDEX_UNDO = [
    "DROP INDEX {{ t }}_claimed",
    "CREATE INDEX {{ t }}_by_status ON {{ t }} (status, claimed_at)",
]


# revision 0003: the send writes the record first, as `queued`, and an effect that fails past the queue's retries
# ends `failed`, for a person: the status CHECK admits both ({{ states_added_in_3|join(", ") }}), and the sweeper finds
# queued records that no run claimed (a message the broker lost) through an index of their own. Per dialect: SQLite
# cannot change a CHECK in place, so it copies the table into one with the new CHECK.
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
}


# revision 0004: every resolution by a person, kept: the record says who resolved it last, this table every time
# (retention deletes completed records, never these). The same SQL on PostgreSQL and SQLite.
RESOLUTIONS = [
    """
    CREATE TABLE {{ t }}_resolutions (
        job_type            VARCHAR(100) NOT NULL,
        operation_key       VARCHAR({{ max_key_length }}) NOT NULL,
        resolved_at         TIMESTAMP WITH TIME ZONE NOT NULL,
        resolved_by         VARCHAR(255) NOT NULL,
        resolved_as         VARCHAR(255) NOT NULL,
        database_role       VARCHAR(255),
        status_before       VARCHAR(16)  NOT NULL,
        status_after        VARCHAR(16)  NOT NULL,
        why                 TEXT         NOT NULL
    )
    """,
    """
    CREATE INDEX {{ t }}_resolutions_operation
        ON {{ t }}_resolutions (job_type, operation_key, resolved_at)
    """,
]

# what undoes RESOLUTIONS
RESOLUTIONS_UNDO = ["DROP TABLE {{ t }}_resolutions"]
