"""The job store: SQLAlchemy tables, typed transactions, storage faults, schema migrations."""
