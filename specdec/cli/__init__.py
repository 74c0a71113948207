"""The `specdec` command and the Python client of the SpecDec service."""
