"""Test helpers that ship with dlcomm: the in-memory fake network (:mod:`.fakenet`).

Used by the test suite and by the simulator's packet check; never by production code paths
that move real gradients.
"""
