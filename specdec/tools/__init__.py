"""Benchmarks (`specdec bench`) and profiling (`specdec profile`), driving the services through their
public interfaces."""
