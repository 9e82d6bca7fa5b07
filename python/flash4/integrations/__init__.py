"""Integrations of flash4 with other libraries (imported on demand: each needs its library installed)."""
