"""Conventions gradacc shares with the libraries it drives.

``IGNORE_INDEX``: the label of an item that counts in no loss (padding, special tokens, a causal LM's first token):
PyTorch's ``cross_entropy`` skips it by default and 🤗's collators pad labels with it.
"""

IGNORE_INDEX = -100
