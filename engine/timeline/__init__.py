"""Instants, the active timeline, commit and plan metadata, locks and heartbeats."""
