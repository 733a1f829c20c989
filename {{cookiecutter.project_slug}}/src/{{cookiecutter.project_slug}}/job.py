{%- from "replay_matrix.jinja" import policy with context -%}
{%- set one_transaction = cookiecutter.effect_kind == "same_database" -%}
{%- set p = cookiecutter.stale_claim_policy -%}
"""What one delivery of a `{{ cookiecutter.job_type }}` message does, whatever queue delivered it.

    claim (INSERT ... ON CONFLICT DO NOTHING)  -> this run owns the work: perform, then complete
    no claim -> read the record:
        another payload            -> conflict: refused, reported
        queued (written by the producer when it sent the message) -> claimed by compare-and-swap, as a new key
        completed, held, failed, abandoned -> skipped
        claimed, younger than the lease -> skipped: another run is working on it (come back after the lease)
        claimed, older than the lease   -> a worker may have died: the stale-claim policy, `{{ p }}`
{%- if one_transaction %}

The effect is a row in the same database: the claim, the effect's row and the completion share one
transaction, so a run that dies part-way leaves nothing behind and the redelivery does the work once.
{%- endif %}

Every skip, hold, takeover and conflict is logged with the job type and the key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

{% if one_transaction -%}
from sqlalchemy import Connection
{% endif -%}
from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError

from . import effect, settings, telemetry
from .claims import (
    BadMessage,
    ClaimRace,
    ClaimStore,
    PayloadConflict,
    Record,
    default_store,
    encode_details,
    fingerprint,
    validate_details,
    validate_key,
)

log = telemetry.delivery_log(__name__)
JOB_TYPE = settings.JOB_TYPE
# The database unreachable (refused, cut, restarting), or unusable until a person acts (a missing table, a failed
# login, a permission: claims.person_needed names it, and the queue's code logs it at ERROR): the queue retries for
# as long as it lasts (tasks.py, consumer.py) and never lets the message go, unlike a bad message, which can never
# succeed and is refused at once.
DATABASE_UNREACHABLE = (OperationalError, InterfaceError, ProgrammingError)
{%- if p in ("hold", "skip") %}
# What `{{ p }}` makes of a claim older than the lease, whether a redelivery or the sweeper meets it: status and note.
AFTER_LEASE = ("{{ policy.after_lease }}", "{{ policy.stale_note }}")
{%- endif %}
{%- if one_transaction %}

# The effect writes with the claim's connection, inside the claim's transaction.
Perform = Callable[[Connection, str, Mapping[str, Any]], None]
{%- else %}

Perform = Callable[[str, Mapping[str, Any]], None]
{%- endif %}
# Hands an operation's message to the queue (producer.publish)
Publish = Callable[[str, Mapping[str, Any]], object]


@dataclass(frozen=True)
class Outcome:
    """What a delivery did. `retry_in` is set when it met a young claim: seconds until that claim's lease ends."""

    action: str  # performed | skipped | held | abandoned | waiting
    reason: str
    retry_in: float | None = None


def handle(
    key: object, details: object = None, *, store: ClaimStore | None = None, perform: Perform | None = None
) -> Outcome:
    """Handles one delivery. Raises BadMessage (never worth a retry) for a bad key or a payload conflict."""
    operation_key = validate_key(key)
    payload = validate_details(details)
    store = store or default_store()
    # looked up at call time, so a replacement of effect.perform (the replay suite's crash points) applies
    perform = perform or effect.perform
    # the details' JSON, encoded once: the record keeps it and the fingerprint hashes it
    encoded = encode_details(payload)
    payload_fingerprint = fingerprint(operation_key, encoded)
{%- if one_transaction %}

    # BEGIN, then the claim or the record another run left (one statement), the effect, the completion, COMMIT
    with store.transaction() as conn:
        with telemetry.claim_span(operation_key):
            found = store.claim_or_read(operation_key, payload_fingerprint, encoded)
        if isinstance(found, str):
            with telemetry.span("effect", operation_key):
                perform(conn, operation_key, payload)
            with telemetry.span("complete", operation_key):
                store.complete(operation_key, found)
    if isinstance(found, str):
        log.line(logging.INFO, "performed", operation_key, 1, "performed and completed in one transaction")
        return Outcome("performed", "claimed, performed and completed in one transaction")
    return _meet_record(store, operation_key, payload, payload_fingerprint, perform, found)
{%- else %}

    # The claim commits on its own before the effect: from here on a death leaves a claim behind.
    with telemetry.claim_span(operation_key):
        found = store.claim_or_read(operation_key, payload_fingerprint, encoded)
    if isinstance(found, str):
        return _perform_and_complete(store, operation_key, payload, found, 1, perform, "claimed")
    return _meet_record(store, operation_key, payload, payload_fingerprint, perform, found)
{%- endif %}


def deliver(
    key: object, details: object = None, *, store: ClaimStore | None = None, perform: Perform | None = None
) -> Outcome:
    """`handle`, as the queue's consumers run it: once more at once when the database connection was lost on the
    way (cut by the network, closed by a restarted server), as the first statement after an outage meets the old
    connection. The store opens another, and a delivery is safe to repeat: a redelivery does no more. A database
    that is still unreachable raises again, for the queue's retry."""
    try:
        try:
            outcome = handle(key, details, store=store, perform=perform)
        except DATABASE_UNREACHABLE as error:
            if not error.connection_invalidated:
                raise
            log.line(
                logging.WARNING, "retrying", key, None, "the database connection was lost; once more, on a new one"
            )
            outcome = handle(key, details, store=store, perform=perform)
    except BadMessage:
        telemetry.count("refused")
        raise
    telemetry.count(outcome.action)
    return outcome


def _meet_record(
    store: ClaimStore,
    key: str,
    details: Mapping[str, Any],
    payload_fingerprint: str,
    perform: Perform,
    record: Record | None,
) -> Outcome:
    """Acts on the record that another run left."""
    if record is None:
        # the other run's claim rolled back between our insert and our read
        raise ClaimRace(f"{JOB_TYPE} {key!r}: the record vanished; try again")
    if record.payload_fingerprint != payload_fingerprint:
        log.line(
            logging.ERROR, "refused", key, record.attempt, "conflict: the key is known with another payload; refused"
        )
        raise PayloadConflict(
            f"{settings.OPERATION_KEY_NAME} {key!r} is already known with a different payload"
            f" (status {record.status}); refused, nothing performed"
        )
    if record.status == "queued":
        # the record the producer wrote before sending: this run claims it as it would a new key
        return _take_over_and_perform(store, key, details, record, perform, "claimed")
    if record.status in ("completed", "held", "failed", "abandoned"):
        log.line(logging.INFO, "skipped", key, record.attempt, "skipped, the record is %s", record.status)
        return Outcome("skipped", f"record is {record.status}")
    if record.status == "released":
        # released by a person, or by a run whose effect failed: one more attempt
        log.line(logging.WARNING, "taking over", key, record.attempt, "released; one more attempt")
        return _take_over_and_perform(store, key, details, record, perform, "released: one more attempt")
    if not record.stale:
        log.line(
            logging.INFO,
            "waiting",
            key,
            record.attempt,
            "skipped, a younger claim (%.0f s of the lease left) belongs to another run; no takeover",
            record.seconds_left,
        )
        return Outcome("waiting", "claim younger than the lease", retry_in=max(record.seconds_left, 0.0) + 1.0)
    return apply_stale_claim_policy(store, key, details, record, perform)


def apply_stale_claim_policy(
    store: ClaimStore, key: str, details: Mapping[str, Any], record: Record, perform: Perform
) -> Outcome:
    """`{{ p }}`: the claim is older than the lease; the run that owned it may have died, before or after the effect."""
{%- if p == "hold" %}
    # Nothing more is done until a person resolves it (operations.py resolve).
    if store.settle_stale(key, record.claim_token, *AFTER_LEASE):
        log.line(logging.WARNING, "held", key, record.attempt, "claim older than the lease; held for a person")
        return Outcome("held", "claim older than the lease")
{%- elif p == "skip" %}
    # Given up for good: nothing is done twice, at the price of a rare miss.
    if store.settle_stale(key, record.claim_token, *AFTER_LEASE):
        log.line(logging.WARNING, "abandoned", key, record.attempt, "claim older than the lease; abandoned for good")
        return Outcome("abandoned", "claim older than the lease")
{%- elif p == "resend" %}
    # Taken over and performed again: nothing is lost, at the price of a rare duplicate.
    return _take_over_and_perform(store, key, details, record, perform, "{{ policy.stale_note }}")
{%- elif p == "lookup" %}
    # Taken over first, so that one run alone asks the provider and acts on its answer.
    token = store.take_over(key, record.claim_token, "{{ policy.stale_note }}")
    attempt = record.attempt + 1
    if token is None:
        log.line(logging.INFO, "skipped", key, record.attempt, "another run took the stale claim over first; skipped")
        return Outcome("skipped", "another run took the stale claim over")
    try:
        found = effect.already_performed(key)
    except Exception as error:
        # the provider could not answer: free the claim, so that the retry asks again
        store.release(key, token, f"lookup failed: {error!r}")
        log.line(logging.WARNING, "released", key, attempt, "the lookup failed (%r); claim released for a retry", error)
        raise
    if found:
        store.complete(key, token)
        log.line(
            logging.WARNING,
            "skipped",
            key,
            attempt,
            "stale claim taken over; the provider has it, completed, not resent",
        )
        return Outcome("skipped", "the provider has the reference")
    log.line(logging.WARNING, "taking over", key, attempt, "stale claim taken over; the provider lacks it, performing")
    return _perform_and_complete(store, key, details, token, attempt, perform, "looked up: absent at the provider")
{%- endif %}
{%- if p in ("hold", "skip") %}
    log.line(logging.INFO, "skipped", key, record.attempt, "another run settled the stale claim first; skipped")
    return Outcome("skipped", "another run settled the stale claim")
{%- endif %}


def _take_over_and_perform(
    store: ClaimStore, key: str, details: Mapping[str, Any], record: Record, perform: Perform, why: str
) -> Outcome:
    # a queued record is claimed, not taken over: no note, as for a new key
    note = None if record.status == "queued" else why
{%- if one_transaction %}
    with store.transaction() as conn:
        with telemetry.claim_span(key):
            token = store.take_over(key, record.claim_token, note)
        if token is not None:
            with telemetry.span("effect", key):
                perform(conn, key, details)
            with telemetry.span("complete", key):
                store.complete(key, token)
    if token is None:
        log.line(logging.INFO, "skipped", key, record.attempt, "another run took the claim over first; skipped")
        return Outcome("skipped", "another run took the claim over")
    log.line(logging.WARNING, "performed", key, record.attempt + 1, "taken over (%s); performed and completed", why)
    return Outcome("performed", why)
{%- else %}
    # compare-and-swap on the old token: of two late runs, one alone wins
    token = store.take_over(key, record.claim_token, note)
    if token is None:
        log.line(logging.INFO, "skipped", key, record.attempt, "another run took the claim over first; skipped")
        return Outcome("skipped", "another run took the claim over")
    log.line(logging.WARNING, "taking over", key, record.attempt + 1, "taken over (%s); performing again", why)
    return _perform_and_complete(store, key, details, token, record.attempt + 1, perform, why)
{%- endif %}
{%- if not one_transaction %}


def _perform_and_complete(
    store: ClaimStore, key: str, details: Mapping[str, Any], token: str, attempt: int, perform: Perform, why: str
) -> Outcome:
    try:
        with telemetry.span("effect", key):
            perform(key, details)
    except Exception as error:
        # An effect that raised is taken as not performed: free the claim for the queue's retry.
        store.release(key, token, f"effect failed: {error!r}")
        log.line(logging.WARNING, "released", key, attempt, "the effect failed (%r); claim released for a retry", error)
        raise
    with telemetry.span("complete", key):
        completed = store.complete(key, token)
    if not completed:
        # The run was slower than the lease and its claim was taken over or held meanwhile.
        log.line(
            logging.ERROR, "performed", key, attempt, "performed, but the claim was no longer this run's; left as it is"
        )
        return Outcome("performed", "performed after losing the claim")
    log.line(logging.INFO, "performed", key, attempt, "performed and completed (%s)", why)
    return Outcome("performed", why)
{%- endif %}


def sweep(
    store: ClaimStore | None = None,
    limit: int = settings.SWEEP_BATCH,
    budget: float | None = None,
    publish: Publish | None = None,
) -> dict[str, int]:
    """Applies the policy to claims older than the lease whose redelivery has not come, then sends again the
    messages of records still queued after RESEND_QUEUED_AFTER_SECONDS (resend_queued).

    The record keeps the message's details, so the sweeper acts as that redelivery would: under `resend` or
    `lookup` it performs the effect itself. It goes on while it finds stale claims, `limit` at a time, and starts
    none after `budget` seconds (settings.SWEEP_BUDGET_SECONDS); what is left waits for the next sweep. No lock
    outlives one statement, so a redelivery meeting one of these claims waits for one statement at most, and of
    the two, the first to change the record wins. Counts: stale claims found, how many it settled, and how many
    queued records it sent again.
    """
    store = store or default_store()
    deadline = time.monotonic() + (settings.SWEEP_BUDGET_SECONDS if budget is None else budget)
    counts = {"stale": 0, "settled": 0, "resent": 0}
    while time.monotonic() < deadline:
{%- if p in ("hold", "skip") %}
        # `{{ p }}` performs nothing: one guarded statement settles a batch (claims.settle_stale_batch)
        settled = store.settle_stale_batch(*AFTER_LEASE, limit=limit)
        for key in settled:
            log.line(
                logging.WARNING, AFTER_LEASE[0], key, None, "sweeper: stale claim and no redelivery; %s", AFTER_LEASE[1]
            )
            telemetry.count(AFTER_LEASE[0])
        counts["stale"] += len(settled)
        counts["settled"] += len(settled)
        if len(settled) < limit:
            break  # that was the last of them
{%- else %}
        # each claim by the policy's own guarded statements, on its token, as its redelivery would
        batch = store.stale_records(limit)
        for key, details, record in batch:
            if time.monotonic() >= deadline:
                break
            counts["stale"] += 1
            log.line(
                logging.WARNING,
                "taking over",
                key,
                record.attempt,
                "sweeper: stale claim and no redelivery; applying `{{ p }}`",
            )
            action = apply_stale_claim_policy(store, key, details, record, effect.perform).action
            telemetry.count(action)
            if action != "skipped":
                counts["settled"] += 1
        if len(batch) < limit:
            break  # that was the last of them
{%- endif %}
    while time.monotonic() < deadline:
        resent = resend_queued(store, limit, publish)
        counts["resent"] += resent
        if resent < limit:
            break
    return counts


def resend_queued(store: ClaimStore, limit: int = settings.SWEEP_BATCH, publish: Publish | None = None) -> int:
    """Sends again the messages of up to `limit` records that the producer wrote and no run has claimed after
    RESEND_QUEUED_AFTER_SECONDS: the broker may have lost them (a worker killed between taking a message and the
    broker filing it as unacknowledged). A copy that was only slow is skipped by the claim. How many it sent."""
    if publish is None:
        from .producer import publish
    after = settings.resend_queued_after_seconds()
    # each record's clock is reset first: one the broker refuses now is sent again at the next window, not lost
    queued = store.resend_queued(after, limit)
    for key, details in queued:
        log.line(
            logging.WARNING, "resent", key, 0, "sweeper: queued %d s ago and not claimed; its message sent again", after
        )
        telemetry.count("resent")
        publish(key, details)
    return len(queued)
