"""Tensor partitioning over heterogeneous accelerators (AccPar, HPCA'20)."""
