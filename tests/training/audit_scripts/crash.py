"""A training script that fails before it trains: the audit passes its exit status on."""
raise RuntimeError("the data folder is empty")
