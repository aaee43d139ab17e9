"""One module per schema revision of the durable history, oldest first (Alembic)."""
