"""Benchmarks: how much the gateway costs next to a plain reverse proxy, measured in one run.

Absolute figures on a shared 2-core machine move 15-25% between runs, so
every table compares rows measured in the same run.
`python -m bench.run` is the entry point (`make bench`); `python -m
bench.soak` watches memory over a long run (`make soak`).
"""
