"""Model execution: the backends a service hosts (`backend.py`), batching, the forward pass, kernels, loading.

Device-specific code has its own sub-packages: `cpu` (the CPU's kernels and their C sources) and `static`
(the decode runner built for CUDA: a KV pool, fixed shapes, CUDA graphs; eager on CPU for tests)."""
