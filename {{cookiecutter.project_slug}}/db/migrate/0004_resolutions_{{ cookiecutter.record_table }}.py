{%- set t = cookiecutter.record_table -%}
"""Keeps every resolution by a person in {{ t }}_resolutions:
who (the name given, the identity the system knew, the database role), when, why, the state before and after.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

from {{ cookiecutter.project_slug }} import schema

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in schema.statements(schema.RESOLUTIONS, op.get_bind().dialect):
        op.execute(statement)


def downgrade() -> None:
    for statement in schema.statements(schema.RESOLUTIONS_UNDO, op.get_bind().dialect):
        op.execute(statement)
