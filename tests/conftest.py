"""Shared fixtures. Tests that need a broker get one embedded pulsar-lite per
session (or $PULSAR_URL); the tracker is tested with an injectable clock."""
