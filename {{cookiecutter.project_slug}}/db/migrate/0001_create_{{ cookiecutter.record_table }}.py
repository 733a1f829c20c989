{%- set t = cookiecutter.record_table -%}
"""Creates {{ t }}, as schema.sql does (the replay suite checks that the two agree).

Revision ID: 0001
"""

from alembic import op

from {{ cookiecutter.project_slug }} import schema

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the statements live in the package, where a Django migration runs them too
    for statement in schema.statements(schema.CREATE, op.get_bind().dialect):
        op.execute(statement)


def downgrade() -> None:
    for statement in schema.statements(schema.DROP, op.get_bind().dialect):
        op.execute(statement)
