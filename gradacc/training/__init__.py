"""Training: the engine, the prepared job, the three backends, and where data and models come from."""
