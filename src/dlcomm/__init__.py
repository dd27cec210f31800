"""dlcomm: the network layer of distributed deep-learning training.

It runs training faster on real networks (pluggable gradient exchanges behind one
interface), emulates clusters on one machine and plans clusters that do not exist yet.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
