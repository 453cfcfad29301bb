"""A script that never steps an optimizer: nothing to audit."""
print("nothing to train here")
