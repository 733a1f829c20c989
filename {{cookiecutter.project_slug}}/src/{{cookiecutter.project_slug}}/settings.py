{%- from "replay_matrix.jinja" import lease_rules, max_key_length, sqs_max_receive_count, sweep_budget_seconds, sweep_every_rule,
    sweep_every_seconds, visibility_rule, visibility_timeout_seconds with context -%}
"""The kit's settings: the answers it was generated with, and what each deployment sets in its environment.

Values from the environment are read when they are used, not at import, so a test or a command can set them
before it starts a worker.
"""

import os

JOB_TYPE = "{{ cookiecutter.job_type }}"
OPERATION_KEY_NAME = "{{ cookiecutter.operation_key_name }}"
RECORD_TABLE = "{{ cookiecutter.record_table }}"
EFFECT_KIND = "{{ cookiecutter.effect_kind }}"
STALE_CLAIM_POLICY = "{{ cookiecutter.stale_claim_policy }}"
# A claim younger than the lease belongs to a run that is still working; the longest normal run is shorter.
LEASE_SECONDS = {{ cookiecutter.lease_seconds|int }}
LONGEST_RUN_SECONDS = {{ cookiecutter.longest_run_seconds|int }}
# The record table's operation_key is VARCHAR({{ max_key_length }}).
MAX_KEY_LENGTH = {{ max_key_length }}
# The sweeper (job.sweep) runs every SWEEP_EVERY_SECONDS, {{ sweep_every_rule }}: a stale claim is settled at most
# that long after its lease ends. It settles stale claims SWEEP_BATCH at a time while it finds them, and starts
# none after SWEEP_BUDGET_SECONDS: the time to the next sweep less the longest run, so that a sweep is over before
# the next one starts.
SWEEP_EVERY_SECONDS = {{ sweep_every_seconds }}
SWEEP_BATCH = 100
SWEEP_BUDGET_SECONDS = {{ sweep_budget_seconds }}
{%- if cookiecutter.queue_system == "celery" %}
# Redis's visibility timeout unless CELERY_VISIBILITY_TIMEOUT says otherwise: {{ visibility_rule }}
VISIBILITY_TIMEOUT_SECONDS = {{ visibility_timeout_seconds }}
{%- endif %}


def max_details_bytes() -> int:
    """MAX_DETAILS_BYTES: the largest message details (as JSON) taken; larger ones are refused as bad messages.
    Default: SQS's 256 KiB for a whole message, less 1 KiB for the key and the envelope."""
    return int(os.environ.get("MAX_DETAILS_BYTES", str(255 * 1024)))


def resend_queued_after_seconds() -> int:
    """RESEND_QUEUED_AFTER_SECONDS: how long a record sent through the kit's producer may stay queued, no run having
    claimed it, before the sweeper sends its message again (the broker may have lost it). Default: the lease. A
    message that was only slow is then delivered twice, which the claim makes harmless."""
    return int(os.environ.get("RESEND_QUEUED_AFTER_SECONDS", str(LEASE_SECONDS)))


# the driver each bare scheme of DATABASE_URL is given
DRIVERS = {
    "postgresql://": "postgresql+psycopg://",
    "postgres://": "postgresql+psycopg://",
    "mysql://": "mysql+pymysql://",
    "mariadb://": "mariadb+pymysql://",
}


def database_url() -> str:
    """DATABASE_URL, with a bare scheme pointed at the driver the kit installs: PostgreSQL at psycopg 3 (SQLAlchemy's
    bare postgresql:// means psycopg2), MySQL and MariaDB at PyMySQL (the `mysql` extra; bare, mysqlclient)."""
    url = os.environ.get("DATABASE_URL", "sqlite:///{{ cookiecutter.project_slug }}.sqlite3")
    for scheme, driver in DRIVERS.items():
        if url.startswith(scheme):
            return driver + url.removeprefix(scheme)
    return url

{%- if cookiecutter.effect_kind == "external_no_reference" %}


def smtp_host() -> str:
    return os.environ.get("SMTP_HOST", "localhost")


def smtp_port() -> int:
    return int(os.environ.get("SMTP_PORT", "25"))


def mail_from() -> str:
    return os.environ.get("MAIL_FROM", "orders@example.com")
{%- elif cookiecutter.effect_kind == "external_with_reference" %}


def provider_url() -> str:
    """Base URL of the provider's HTTP API: it takes the operation key as its reference and can be asked for it."""
    return os.environ.get("PROVIDER_URL", "http://localhost:8025").rstrip("/")
{%- endif %}
{%- if cookiecutter.queue_system == "celery" %}


def broker_url() -> str:
    """CELERY_BROKER_URL: Redis (redis://) or RabbitMQ (amqp://); one kit serves both."""
    return os.environ.get("CELERY_BROKER_URL", "redis://localhost:6379/0")


def on_rabbitmq() -> bool:
    return broker_url().startswith(("amqp://", "amqps://", "pyamqp://"))


def queue_name() -> str:
    return os.environ.get("CELERY_QUEUE", JOB_TYPE)


def result_backend() -> str:
    """CELERY_RESULT_BACKEND; unset: on RabbitMQ, rpc:// (results go back to the sender as messages: Celery 5
    has no amqp:// result backend), else the broker's own Redis database."""
    return os.environ.get("CELERY_RESULT_BACKEND", "rpc://" if on_rabbitmq() else broker_url())


def rabbitmq_consumer_timeout() -> int:
    """Seconds RabbitMQ lets a delivery stay unacknowledged before it closes the channel: the server's
    `consumer_timeout` (rabbitmq.conf, in milliseconds there; 30 minutes by default), which a client cannot ask
    for. Set CELERY_RABBITMQ_CONSUMER_TIMEOUT to the server's value when it is not the default."""
    return int(os.environ.get("CELERY_RABBITMQ_CONSUMER_TIMEOUT", "1800"))


def visibility_timeout() -> int:
    """Seconds before Redis hands an unacknowledged message to another worker.

    It must exceed the lease: a redelivery inside the lease is put back with a countdown to the lease's end,
    and Redis would hand that waiting message out again if its visibility ran out first. Tests shorten it.
    Default: VISIBILITY_TIMEOUT_SECONDS.
    """
    return int(os.environ.get("CELERY_VISIBILITY_TIMEOUT", str(VISIBILITY_TIMEOUT_SECONDS)))
{%- endif %}
{%- if cookiecutter.queue_system == "sqs" %}


# SQS refuses a visibility timeout longer than 12 hours.
SQS_MAX_VISIBILITY_SECONDS = {{ lease_rules.sqs_receives.visibility_limit }}
# How long the queue keeps a message (create-queues sets it): 14 days, SQS's longest, so that a message waiting for
# the end of a lease does not expire meanwhile. No message comes back later than that: `retain` keeps records longer.
SQS_MESSAGE_RETENTION_SECONDS = 14 * 24 * 3600


def aws_region() -> str | None:
    """AWS_REGION (Lambda sets it) or AWS_DEFAULT_REGION; unset: boto3's configuration (~/.aws/config).

    Passed to every client the kit makes: boto3 itself reads AWS_DEFAULT_REGION only, not AWS_REGION.
    """
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def sqs_endpoint_url() -> str | None:
    """A local endpoint (moto, LocalStack, ElasticMQ): SQS_ENDPOINT_URL, or AWS's own AWS_ENDPOINT_URL_SQS or
    AWS_ENDPOINT_URL, in that order; unset: AWS itself."""
    for name in ("SQS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return os.environ[name]
    return None


def queue_name() -> str:
    return os.environ.get("SQS_QUEUE_NAME", JOB_TYPE)


def queue_url() -> str | None:
    """SQS_QUEUE_URL; unset: the URL of the queue named SQS_QUEUE_NAME (the job type) is looked up."""
    return os.environ.get("SQS_QUEUE_URL") or None


def dead_letter_queue_name() -> str:
    return os.environ.get("SQS_DEAD_LETTER_QUEUE_NAME", f"{queue_name()}-dead-letter")


def dead_letter_queue_url() -> str | None:
    """SQS_DEAD_LETTER_QUEUE_URL; unset: the target of the queue's redrive policy."""
    return os.environ.get("SQS_DEAD_LETTER_QUEUE_URL") or None


def visibility_timeout() -> int:
    """Seconds a received message stays invisible to other consumers: it covers the longest normal run twice.

    A consumer that dies leaves its message to come back after this. Tests shorten it.
    """
    default = min(max(30, 2 * LONGEST_RUN_SECONDS), SQS_MAX_VISIBILITY_SECONDS)
    return int(os.environ.get("SQS_VISIBILITY_TIMEOUT", str(default)))


def wait_time_seconds() -> int:
    """Long polling: how long one receive waits for a message (SQS allows 0 to 20)."""
    return int(os.environ.get("SQS_WAIT_TIME_SECONDS", "20"))


def max_receive_count() -> int:
    """The redrive policy's maxReceiveCount: after this many receives a message moves to the dead-letter queue.

    A backstop for messages that fail in a way the consumer cannot name (it dead-letters bad messages itself, at
    once). A healthy message is received once, plus once per worker death, per transient failure, and per wait
    of up to 12 hours inside a lease: the default leaves room for all of them.
    """
    return int(os.environ.get("SQS_MAX_RECEIVE_COUNT", "{{ sqs_max_receive_count }}"))


def sweep_every_seconds() -> int:
    """How often a consumer runs the sweeper between messages; 0: never (run `operations sweep` from cron)."""
    return int(os.environ.get("SQS_SWEEP_EVERY_SECONDS", str(SWEEP_EVERY_SECONDS)))
{%- endif %}
