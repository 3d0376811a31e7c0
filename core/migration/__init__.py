"""Moving a running component to other devices: Reboot, Workload and P2P."""
