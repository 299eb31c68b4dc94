"""Op table: reduction ops."""
