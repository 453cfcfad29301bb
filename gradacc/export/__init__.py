"""Runs leave gradacc here: experiment trackers written from the event stream (no torch at import)."""
