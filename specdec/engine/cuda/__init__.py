"""CUDA's own kernels (Triton): `pool_attention`, the static runner's attention over its KV pool. Imported only
where they run: `specdec.engine.static` takes them on CUDA when Triton is there. The CPU's are in
`specdec.engine.cpu`."""
