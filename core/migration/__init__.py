"""Moving a running component to other devices: Workload and P2P."""
