"""Emulation: clusters of network namespaces with shaped links, and time-dilated workloads."""
