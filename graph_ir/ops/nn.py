"""Op table: nn ops."""
