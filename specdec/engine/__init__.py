"""Model execution: the backends a service hosts (`backend.py`), batching, the forward pass, kernels, loading."""
