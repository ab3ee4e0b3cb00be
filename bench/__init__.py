"""Benchmarks (``make bench``): measured on this machine against the real local services.

They report figures, they do not pass or fail: a timed assertion on a shared machine would
fail for reasons that have nothing to do with the code.
"""
