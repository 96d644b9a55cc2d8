"""Diagnostics: scripts that explain where a benchmark figure comes from
(profiles, heap breakdowns, timestamps along a path), run as
``python -m bench.lab.<name>``. They state no target and write no results file."""
