"""Benchmarks: measurements written as JSON, variants compared side by side in one run.

Every job a benchmark starts is bounded: :data:`JOB_DEADLINE_S` for the ranks it launches
(a worker stuck outside any collective is stopped too), a timeout for every subprocess.
"""

JOB_DEADLINE_S = 3600.0
