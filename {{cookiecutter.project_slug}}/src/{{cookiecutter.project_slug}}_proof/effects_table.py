"""The effect's own table, `{{ cookiecutter.job_type }}_effects`: rows the job wrote in the claim's transaction,
counted per operation key."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import Engine, text


class EffectsTable:
    """Counts the effect's rows in the database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def env(self) -> dict[str, str]:
        return {}

    def count(self, key: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM {{ cookiecutter.job_type }}_effects WHERE operation_key = :key"),
                    {"key": key},
                ).scalar_one()
            )

    def counts(self, prefix: str = "") -> Counter[str]:
        """The effect's rows per key, for the keys that start with `prefix`."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT operation_key, count(*) FROM {{ cookiecutter.job_type }}_effects"
                    " WHERE substr(operation_key, 1, :length) = :prefix GROUP BY operation_key"
                ),
                {"length": len(prefix), "prefix": prefix},
            )
            return Counter({str(key): int(number) for key, number in rows})

    def reset(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM {{ cookiecutter.job_type }}_effects"))
