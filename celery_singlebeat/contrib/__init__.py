"""Optional integrations; each imports its framework only when used."""
