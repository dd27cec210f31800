"""``dlcomm advise``: will in-network aggregation, sparsity, compression or decentralized
sync pay for this job? (docs/advise.md)

- :mod:`.profile`: the job's iteration (catalog, or measured here), buckets, density;
- :mod:`.cost`: the cost model of one iteration per candidate (pure);
- :mod:`.candidates`: exchanges and compressors, the latter measured on this CPU;
- :mod:`.run`: ranking, the link-rate sweep, confidence, the JSON result (pure);
- :mod:`.verify`: the top candidates run for real, and the prediction scored;
- :mod:`.main`, :mod:`.report`, :mod:`.commands`: end to end, table and plot, CLI.
"""
