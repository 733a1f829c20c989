{%- from "replay_matrix.jinja" import doc, py, description with context -%}
"""The effect of `{{ cookiecutter.job_type }}`, the file to edit:
{{ doc(description) }}.

`perform` is called only by a run that holds the operation's claim. It must raise when the effect did not
happen; an exception releases the claim so that the queue's retry can claim it again.
"""
{% if cookiecutter.effect_kind == "external_no_reference" %}
import smtplib
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any

from . import settings

# the email's subject, before the key
SUBJECT = {{ py(cookiecutter.project_name) }}
# the header that names the operation: where a provider's logs, and the replay suite's SMTP sink, find the key
KEY_HEADER = "X-Operation-Key"


def perform(key: str, details: Mapping[str, Any]) -> None:
    """Sends the email over SMTP. The provider takes no reference, so nothing here can tell a resend."""
    message = EmailMessage()
    message["From"] = settings.mail_from()
    message["To"] = str(details.get("email", "customer@example.com"))
    message["Subject"] = f"{SUBJECT} {key}"
    message[KEY_HEADER] = key
    message.set_content(f"Thank you. This confirms {key}.\n")
    with smtplib.SMTP(settings.smtp_host(), settings.smtp_port(), timeout=30) as smtp:
        smtp.send_message(message)
{%- elif cookiecutter.effect_kind == "external_with_reference" %}
from collections.abc import Mapping
from typing import Any

from . import settings
from .provider import HttpProvider, Provider


def provider() -> Provider:
    return HttpProvider(settings.provider_url())


def perform(key: str, details: Mapping[str, Any]) -> None:
    """Calls the provider with the operation key as its reference."""
    provider().send(
        reference=key,
        message={"to": str(details.get("email", "customer@example.com")), "subject": f"Confirmation {key}"},
    )


def already_performed(key: str) -> bool:
    """Asks the provider whether it holds the reference: the lookup policy's question after the lease."""
    return provider().has(reference=key)
{%- else %}
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, text


def perform(conn: Connection, key: str, details: Mapping[str, Any]) -> None:
    """Writes the effect's row in the claim's own transaction: it commits, or rolls back, with the claim."""
    conn.execute(
        text(
            """
            INSERT INTO {{ cookiecutter.job_type }}_effects (operation_key, payload, performed_at)
            VALUES (:key, :payload, CURRENT_TIMESTAMP)
            """
        ),
        {"key": key, "payload": json.dumps(dict(details), sort_keys=True)},
    )
{%- endif %}
