{%- set t = cookiecutter.record_table -%}
"""The record an app writes when it sends (queued), and an effect that failed past the queue's retries (failed), in
{{ t }}; its queued rows indexed for the sweeper's re-send.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

from {{ cookiecutter.project_slug }} import schema

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in schema.statements(schema.QUEUED_AND_FAILED, op.get_bind().dialect):
        op.execute(statement)


def downgrade() -> None:
    for statement in schema.statements(schema.QUEUED_AND_FAILED_UNDO, op.get_bind().dialect):
        op.execute(statement)
