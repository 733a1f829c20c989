"""The application's first migration: its customers.

Revision ID: a1b2c3d4e5f6
"""

from alembic import op

revision = "a1b2c3d4e5f6"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE TABLE customers (id SERIAL PRIMARY KEY, email VARCHAR(255) NOT NULL)")


def downgrade() -> None:
    op.execute("DROP TABLE customers")
