"""Deferrable triggers."""
