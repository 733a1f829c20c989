"""The kit's Django migrations: its tables, from the statements in schema.py."""
