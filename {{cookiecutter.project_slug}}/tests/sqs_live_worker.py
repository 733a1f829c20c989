{%- set slug = cookiecutter.project_slug -%}
"""The kit's consumer as the live replay suite runs it: `python -m sqs_live_worker` (tests on PYTHONPATH).

What differs from `python -m {{ slug }}.consumer`: the effect has a crash point, each settled
message is written to a file the suite reads, and a consumer that lost the database asks for it again more often.
When the suite has given an order (REPLAY_PAUSE_DIR), the first run to reach the effect pauses before or after
it, and the suite kills this process with SIGKILL (or, ordered to freeze, it stops itself with SIGSTOP until the
suite sends SIGCONT).
"""

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from crash_points import PauseOrders, pausing

from {{ slug }} import consumer, effect
from {{ slug }}.consumer import Consumer, Settled

workdir = Path(os.environ["REPLAY_PAUSE_DIR"])
settlements = workdir / f"settled-{os.getpid()}.jsonl"
# The effect's own perform (whichever kind of effect it is), with the crash point when ordered.
perform = pausing(effect.perform, PauseOrders(workdir))
# Every fifth of a second rather than up to every 5 s, so that the fault tests' outages end in a second or two.
consumer.DATABASE_PROBE_MAX_SECONDS = 0.2


def record(settled: Settled) -> None:
    # one short line per append: the suite reads whole lines only
    with settlements.open("a") as out:
        out.write(json.dumps(asdict(settled)) + "\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Consumer(perform=perform, on_settled=record).run()
