"""Code that runs on the nodes. Standard library and pynvml only; see node.py."""
