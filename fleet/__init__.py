"""fleet: profile GPU workloads with Nsight across shared servers and Slurm clusters."""

__version__ = "0.1.0"
