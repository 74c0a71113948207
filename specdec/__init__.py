"""specdec: distributed speculative decoding, one namespace split by job (docs/ARCHITECTURE.md, "Packages")."""
