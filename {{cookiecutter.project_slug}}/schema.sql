{%- from "replay_matrix.jinja" import kind, max_key_length, states with context -%}
{%- set t = cookiecutter.record_table -%}
-- The record of handled operations for {{ cookiecutter.job_type }}: one row per operation key, written when the
-- app sends it through the kit's producer (queued), or when a run first claims it. Runs as it is on PostgreSQL
-- and on SQLite; the migrations in db/migrate/ match it.
--
-- The claim is `INSERT ... ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING claim_token`: a returned
-- row means this run owns the work. Timestamps have no default because they come from the database's own
-- clock, written by the claim code in SQL (PostgreSQL: clock_timestamp(); SQLite: julianday('now'), a
-- fraction of days), so that "older than the lease" is decided by one clock, never a worker's.
CREATE TABLE {{ t }} (
    job_type            VARCHAR(100) NOT NULL,
    operation_key       VARCHAR({{ max_key_length }}) NOT NULL,
    -- sha256 of the message's payload: the same key with another payload is a conflict, not a duplicate
    payload_fingerprint VARCHAR(64)  NOT NULL,
    -- the message's details as JSON, so that the sweeper can act as a redelivery would (resend, lookup)
    -- when none comes; NULL where the job rebuilds them from the key
    payload             TEXT,
{%- for name, state in states.items() %}
    -- {{ name }}: {{ state.meaning|wordwrap(100, wrapstring="\n    --   ") }}
{%- endfor %}
    status              VARCHAR(16)  NOT NULL DEFAULT 'claimed',
    -- new on every claim and takeover: completion and takeover compare it, so a slow original run
    -- cannot overwrite a newer claim and two late redeliveries cannot both take over
    claim_token         VARCHAR(36)  NOT NULL,
    -- 0 while queued; each claim and takeover adds one
    attempt             INTEGER      NOT NULL DEFAULT 1,
    -- when a run claimed it; while queued, when it was sent (the sweeper sends it again after a while)
    claimed_at          TIMESTAMP WITH TIME ZONE NOT NULL,
    completed_at        TIMESTAMP WITH TIME ZONE,
    -- why a claim was held, abandoned or taken over, and who resolved a held one, when
    note                TEXT,
    resolved_by         VARCHAR(255),
    resolved_at         TIMESTAMP WITH TIME ZONE,
    CONSTRAINT {{ t }}_status CHECK (status IN ({% for name in states %}'{{ name }}'{{ ', ' if not loop.last }}{% endfor %})),
    CONSTRAINT {{ t }}_operation UNIQUE (job_type, operation_key)
);

-- The sweeper's question: which claims are older than the lease? Partial: only rows being worked on are in it, so
-- it stays a few kilobytes whatever the number of completed rows (a later revision replaced the first one's full
-- index `{{ t }}_by_status (status, claimed_at)` with this one). Every other statement finds its row through the
-- unique (job_type, operation_key) index: the guards on status are written `status || '' = 'claimed'`, which no
-- index matches, so that the planner never walks this index's claimed rows to find one key.
CREATE INDEX {{ t }}_claimed ON {{ t }} (claimed_at) WHERE status = 'claimed';

-- The sweeper's other question: which operations were sent but never claimed (a message the broker lost)? Partial
-- as well: only queued rows are in it.
CREATE INDEX {{ t }}_queued ON {{ t }} (claimed_at) WHERE status = 'queued';

-- Every resolution by a person (the commands' resolve): the record keeps who resolved it last, this table every
-- time, and retention, which deletes completed records, leaves it alone.
CREATE TABLE {{ t }}_resolutions (
    job_type            VARCHAR(100) NOT NULL,
    operation_key       VARCHAR({{ max_key_length }}) NOT NULL,
    -- the database's clock
    resolved_at         TIMESTAMP WITH TIME ZONE NOT NULL,
    -- the name the person gave (--by)
    resolved_by         VARCHAR(255) NOT NULL,
    -- who the system knew them as: the OS user and host of a command
    resolved_as         VARCHAR(255) NOT NULL,
    -- the role the database itself saw (PostgreSQL's current_user; NULL on SQLite, which has none)
    database_role       VARCHAR(255),
    -- held or failed before; completed (done) or queued (one more attempt) after
    status_before       VARCHAR(16)  NOT NULL,
    status_after        VARCHAR(16)  NOT NULL,
    why                 TEXT         NOT NULL
);
CREATE INDEX {{ t }}_resolutions_operation ON {{ t }}_resolutions (job_type, operation_key, resolved_at);
{%- if kind.one_transaction %}

-- The effect itself: a row written in the claim's own transaction. No unique key on purpose: the replay
-- suite counts these rows, so a second effect would show rather than fail.
CREATE TABLE {{ cookiecutter.job_type }}_effects (
    operation_key       VARCHAR({{ max_key_length }}) NOT NULL,
    payload             TEXT         NOT NULL,
    performed_at        TIMESTAMP WITH TIME ZONE NOT NULL
);
{%- endif %}
