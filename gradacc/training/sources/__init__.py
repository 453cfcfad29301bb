"""Where a run's data and model come from: built-in, a local folder or file, an upload, the hub."""
