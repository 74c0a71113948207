"""Plain arithmetic over measured curves: cost profiles, the γ controller, what sessions hand on, deadlines."""
