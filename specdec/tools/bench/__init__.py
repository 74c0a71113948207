"""`specdec bench`: speed, compute paths, network delay, concurrency, tensor parallelism, tracing cost."""
