"""Code that runs on the nodes (standard library and pynvml only; see node.py), and
bundle.py, which ships it."""
