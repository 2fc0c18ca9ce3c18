"""Integration tests against real systems (a Slurm cluster, torchrun); see conftest.py for how they start."""
