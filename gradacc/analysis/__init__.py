"""What gradacc proves from runs and models: gradient equivalence, memory plans, the comparison of two runs."""
