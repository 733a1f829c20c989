{%- set t = cookiecutter.record_table -%}
"""Indexes only the claimed rows of {{ t }} for the sweeper,
in place of the index of every row by status.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

from {{ cookiecutter.project_slug }} import schema

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in schema.statements(schema.CLAIMED_INDEX, op.get_bind().dialect):
        op.execute(statement)


def downgrade() -> None:
    for statement in schema.statements(schema.CLAIMED_INDEX_UNDO, op.get_bind().dialect):
        op.execute(statement)
