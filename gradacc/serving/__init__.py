"""Runs in the background for the app: the run manager, its store, limits and warm-up. No torch at import."""
