"""Sandbox: resource limits and confinement for workers and the processes they start (SPEC D3)."""
