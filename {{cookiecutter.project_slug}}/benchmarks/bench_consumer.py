"""The kit's SQS consumer with the benchmark's handlers: the same receive loop and effect, without the claim.

benchmark.py runs `python benchmarks/bench_consumer.py bare` (the effect alone) and, where the effect is not a
row in the claim's transaction, `... floor` (the kit's claim and completion statements, raw, around the effect)
beside `python -m {{ cookiecutter.project_slug }}.consumer`, each on a queue of its own.
"""

from __future__ import annotations

import logging
{%- if cookiecutter.effect_kind != "same_database" %}
import os
{%- endif %}
import sys
from collections.abc import Mapping
from typing import Any

{% if cookiecutter.effect_kind != "same_database" -%}
from measure import FLOOR_FILE, Floor

{% endif -%}
from {{ cookiecutter.project_slug }} import effect
{%- if cookiecutter.effect_kind == "same_database" %}
from {{ cookiecutter.project_slug }}.claims import default_store
{%- endif %}
from {{ cookiecutter.project_slug }}.consumer import Consumer, Settled, parse_body


class BareConsumer(Consumer):
    """Performs the effect of each message and deletes it: no claim, no record. (`perform` is the Consumer's
    replacement of the effect, for the replay suite: not used here.)"""

    def act(self, key: str, details: dict[str, Any]) -> None:
{%- if cookiecutter.effect_kind == "same_database" %}
        with default_store().engine.begin() as conn:
            effect.perform(conn, key, details)
{%- else %}
        effect.perform(key, details)
{%- endif %}

    def process(self, message: Mapping[str, Any], received_at: float | None = None) -> Settled:
        key, details = parse_body(str(message["Body"]))
        self.act(str(key), dict(details) if isinstance(details, Mapping) else {})
        receipt = str(message["ReceiptHandle"])
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=receipt)
        return Settled(str(message["MessageId"]), "SUCCESS", "performed", 1, receipt)
{%- if cookiecutter.effect_kind != "same_database" %}


class FloorConsumer(BareConsumer):
    """The physical floor: the kit's claim and completion statements, raw, around the effect."""

    floor = Floor.load(os.environ[FLOOR_FILE]) if FLOOR_FILE in os.environ else None

    def act(self, key: str, details: dict[str, Any]) -> None:
        assert self.floor is not None, f"{FLOOR_FILE} names no file of the floor's statements"
        self.floor.run(key, lambda: effect.perform(key, details))
{%- endif %}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
{%- if cookiecutter.effect_kind != "same_database" %}
    consumers = {"bare": BareConsumer, "floor": FloorConsumer}
{%- else %}
    consumers = {"bare": BareConsumer}
{%- endif %}
    consumers[sys.argv[1] if len(sys.argv) > 1 else "bare"]().run()
