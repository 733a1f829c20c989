{%- from "replay_matrix.jinja" import kind, max_key_length, states with context -%}
{%- set t = cookiecutter.record_table -%}
-- schema.sql for MySQL 8 and MariaDB 10.5 and later: the same tables and the same rules, in their types. The
-- migrations in db/migrate/ make these tables on a MySQL or MariaDB DATABASE_URL; the suite checks that the two
-- agree on MariaDB (MySQL 8 was not run here). Read schema.sql for what each column means.
--
-- What differs from schema.sql:
-- - The claim is a plain INSERT that the unique key refuses with a duplicate-key error (MySQL has no ON CONFLICT
--   and no RETURNING); MySQL's INSERT IGNORE is not used: it would turn other errors into warnings too.
-- - The keys compare their bytes, trailing spaces and case included, as on PostgreSQL: a NO PAD binary
--   collation, which MariaDB names utf8mb4_nopad_bin and MySQL 8 utf8mb4_0900_bin (write that one there).
-- - Timestamps are DATETIME(6) in UTC, from the database's clock, UTC_TIMESTAMP(6).
-- - The details fit MEDIUMTEXT (up to 16 MB; TEXT stops at 64 KB).
-- - No partial index: the sweeper's index is (status, claimed_at), for claimed and queued rows alike.
CREATE TABLE {{ t }} (
    job_type            VARCHAR(100) COLLATE utf8mb4_nopad_bin NOT NULL,
    operation_key       VARCHAR({{ max_key_length }}) COLLATE utf8mb4_nopad_bin NOT NULL,
    payload_fingerprint VARCHAR(64)  NOT NULL,
    payload             MEDIUMTEXT,
    status              VARCHAR(16)  NOT NULL DEFAULT 'claimed',
    claim_token         VARCHAR(36)  NOT NULL,
    attempt             INTEGER      NOT NULL DEFAULT 1,
    claimed_at          DATETIME(6)  NOT NULL,
    completed_at        DATETIME(6),
    note                TEXT,
    resolved_by         VARCHAR(255),
    resolved_at         DATETIME(6),
    CONSTRAINT {{ t }}_status CHECK (status IN ({% for name in states %}'{{ name }}'{{ ', ' if not loop.last }}{% endfor %})),
    CONSTRAINT {{ t }}_operation UNIQUE (job_type, operation_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

CREATE INDEX {{ t }}_claimed ON {{ t }} (status, claimed_at);

CREATE TABLE {{ t }}_resolutions (
    job_type            VARCHAR(100) COLLATE utf8mb4_nopad_bin NOT NULL,
    operation_key       VARCHAR({{ max_key_length }}) COLLATE utf8mb4_nopad_bin NOT NULL,
    resolved_at         DATETIME(6)  NOT NULL,
    resolved_by         VARCHAR(255) NOT NULL,
    resolved_as         VARCHAR(255) NOT NULL,
    database_role       VARCHAR(255),
    status_before       VARCHAR(16)  NOT NULL,
    status_after        VARCHAR(16)  NOT NULL,
    why                 TEXT         NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE INDEX {{ t }}_resolutions_operation ON {{ t }}_resolutions (job_type, operation_key, resolved_at);
{%- if kind.one_transaction %}

CREATE TABLE {{ cookiecutter.job_type }}_effects (
    operation_key       VARCHAR({{ max_key_length }}) COLLATE utf8mb4_nopad_bin NOT NULL,
    payload             MEDIUMTEXT   NOT NULL,
    performed_at        DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
{%- endif %}
