"""Planning: topologies and their cost, DL traffic patterns, tensor partitioning, simulation."""
