"""The reliability suite: `lambda-platform up` under kill -9 faults, checked against an oracle.

``harness.run_chaos`` is the one entry point; ``test_chaos.py`` runs it bounded (slow tier) and
``benchmarks/chaos.py`` runs it long with a summary table.
"""
