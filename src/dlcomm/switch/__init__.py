"""The aggregation switch: a pure dataplane state machine, job control, and a UDP service."""
