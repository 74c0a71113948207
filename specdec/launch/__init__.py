"""Stacks that start the services: embedded (loopback child processes), Ray, and a delay proxy."""
