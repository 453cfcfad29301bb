"""Memory: what a run holds (measured), the budget it must fit, and the levers that change it."""
